import Conveyor

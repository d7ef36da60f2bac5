print("conveyor")

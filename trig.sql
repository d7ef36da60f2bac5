INSERT INTO trig (queue,payload,status,priority,run_at,created_at) VALUES ('bench','\x7b7d','ready',0,now(),now());

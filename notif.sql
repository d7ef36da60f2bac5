WITH i AS (INSERT INTO notif (queue,payload,status,priority,run_at,created_at) VALUES ('bench','\x7b7d','ready',0,now(),now()) RETURNING id) SELECT i.id FROM i, (SELECT pg_notify('chan','bench')) n;

INSERT INTO trig (queue, payload, status, priority, run_at, created_at, dedup_key)
    SELECT 'bench', j.payload, CASE WHEN r.run_at <= n.now THEN 'ready' ELSE 'scheduled' END, j.priority,
      r.run_at, n.now, j.key
    FROM (SELECT coalesce(NULL::timestamptz, date_trunc('milliseconds', statement_timestamp())) AS now) AS n,
      unnest(ARRAY['\x7b7d'::bytea], ARRAY[0::int8], ARRAY[NULL::int8], ARRAY['2020-01-01'::timestamptz], ARRAY[NULL::bytea])
        WITH ORDINALITY AS j(payload, priority, delay, at, key, ordinal),
      LATERAL (SELECT CASE WHEN j.at IS NOT NULL THEN j.at
        WHEN j.delay IS NOT NULL THEN least(n.now + j.delay * interval '1 millisecond', '9999-12-31 23:59:59+00'::timestamptz)
        ELSE n.now END AS run_at) AS r
    ORDER BY j.ordinal
    RETURNING id;

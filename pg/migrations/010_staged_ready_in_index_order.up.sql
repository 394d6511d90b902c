-- jetgres.staged_ready read every ready row of both staging tables, sorted them and kept the
-- first p_limit: with the progress joined in from a one-row CTE the planner could not start
-- an index scan at it, nor stop one early. After jetgres was down while applications kept
-- publishing, a backlog of 300,000 rows cost each move a 50 MB sort on disk (170-290 ms) to
-- take 8,192 of them. Each table now takes at most p_limit rows in index order, from the
-- progress read through scalar subqueries (index conditions), and the two are merged.
CREATE OR REPLACE FUNCTION jetgres.staged_ready(p_limit integer)
RETURNS TABLE (xid xid8, call bigint, stream_id bigint, subject text, hdr bytea, data bytea)
LANGUAGE sql STABLE AS $$
    SELECT r.* FROM (
        (SELECT s.xid, s.call, s.stream_id, s.subject, s.hdr, s.data FROM jetgres.staged_0 s
         WHERE (s.xid, s.call) > ((SELECT st.moved_xid FROM jetgres.staging st), (SELECT st.moved_call FROM jetgres.staging st))
           AND s.xid < pg_snapshot_xmin(pg_current_snapshot())
         ORDER BY s.xid, s.call
         LIMIT p_limit)
        UNION ALL
        (SELECT s.xid, s.call, s.stream_id, s.subject, s.hdr, s.data FROM jetgres.staged_1 s
         WHERE (s.xid, s.call) > ((SELECT st.moved_xid FROM jetgres.staging st), (SELECT st.moved_call FROM jetgres.staging st))
           AND s.xid < pg_snapshot_xmin(pg_current_snapshot())
         ORDER BY s.xid, s.call
         LIMIT p_limit)
    ) r
    ORDER BY r.xid, r.call
    LIMIT p_limit
$$;

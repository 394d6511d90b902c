-- jetgres.next, ack and ack_through read jetgres.msgs through jetgres.sqlc_msgs in
-- statements that plpgsql keeps prepared; after five calls PostgreSQL may run such a
-- statement with a generic plan, which locks and opens every partition of jetgres.msgs,
-- every chunk of every stream, at each call, because the stream it reads is a parameter.
-- Measured on PostgreSQL 15 with 256 streams: 798 locks and 40-50 ms a call, where a plan
-- made for the call's own values opens one chunk, takes 37 locks and 2-4 ms. Planning each
-- call for its values is what jetgres's own reads do (pg/read.go, customPlan).
ALTER FUNCTION jetgres.next(text, text, integer, boolean) SET plan_cache_mode = force_custom_plan;
ALTER FUNCTION jetgres.ack(text, text, bigint) SET plan_cache_mode = force_custom_plan;
ALTER FUNCTION jetgres.ack_through(text, text, bigint) SET plan_cache_mode = force_custom_plan;

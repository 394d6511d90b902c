-- The functions applications call run in the application's own session, whose jit setting
-- is the database's: on by default. Reading a thousand messages from a large chunk costs
-- more than jit_above_cost, and compiling the statement then takes 100-200 ms where the read
-- takes 1 ms. These functions' statements are short and run again and again, so JIT never
-- pays for itself on them; jetgres's own connections turn it off too (pg.Open).
ALTER FUNCTION jetgres.next(text, text, integer, boolean) SET jit = off;
ALTER FUNCTION jetgres.ack(text, text, bigint) SET jit = off;
ALTER FUNCTION jetgres.ack_through(text, text, bigint) SET jit = off;
ALTER FUNCTION jetgres.messages(text, bigint, text, bigint) SET jit = off;

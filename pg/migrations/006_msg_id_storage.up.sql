-- Placeholder for the msg-id storage migration that lands on another branch with this
-- number; migrations must run without gaps, so 007 needs a 006 until that one is merged.
SELECT 1;

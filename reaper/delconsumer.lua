-- delconsumer.lua: remove an idle consumer from a group only if it has
-- nothing pending. XGROUP DELCONSUMER drops the consumer's pending entries
-- with it, so checking XINFO first and deleting afterwards would lose any
-- entry the consumer read in between (invariant 2: nothing silently
-- dropped). The check and the delete must be one atomic step.
--
-- KEYS[1]  the stream
-- ARGV[1]  the consumer group
-- ARGV[2]  the consumer name
--
-- Returns -1 when the consumer has pending entries (nothing removed), else
-- DELCONSUMER's reply (the number of pending entries dropped: 0).
-- One key only, so the script runs on any Redis Cluster slot.
local p = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #p > 0 then
  return -1
end
return redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])

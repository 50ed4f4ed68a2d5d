-- uncount.lua: give an entry back the delivery count it had before a
-- re-drive that Stripe failed transiently (5xx, 429, timeout, network), so
-- that an outage longer than --max-deliveries passes does not dead-letter
-- every pending event. Only while the entry is still this reaper's: if
-- anyone else claimed it meanwhile, their delivery stands.
--
-- KEYS[1]  the stream
-- ARGV[1]  the consumer group
-- ARGV[2]  the reaper's consumer name
-- ARGV[3]  the entry id
-- ARGV[4]  the delivery count to restore
--
-- Returns 1 when restored, 0 when the entry is no longer ours. XCLAIM also
-- resets the idle time, so the entry waits a full --min-idle before the next
-- re-drive: the back-off. One key only, so it runs on any cluster slot.
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1, ARGV[2])
if #p == 0 then
  return 0
end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'RETRYCOUNT', ARGV[4], 'JUSTID')
return 1

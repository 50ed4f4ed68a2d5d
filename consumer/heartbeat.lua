-- heartbeat.lua: renew this consumer's hold on PEL entries (Redis Streams has
-- no lock renewal; this is ours, closing "reclaim while in flight").
--
-- KEYS[1]  the stream
-- ARGV[1]  the consumer group
-- ARGV[2]  this consumer's name
-- ARGV[3…] entry ids this consumer believes it holds
--
-- For each id, XPENDING first checks that ARGV[2] still owns the entry: a bare
-- `XCLAIM … 0` would steal the entry back from a reaper that claimed it. Only
-- then does `XCLAIM <stream> <group> <self> 0 <id> JUSTID` reset the entry's
-- idle time (JUSTID does not bump the delivery count).
--
-- Returns the ids still owned (renewed, or trimmed from the stream but still
-- in our PEL). An id missing from the reply was claimed by someone else or
-- acked: the caller's hold on it is lost.
-- One key only, so the script runs on any Redis Cluster slot.
local owned = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)
  if #p == 1 and p[1][2] == ARGV[2] then
    if #redis.call('XRANGE', KEYS[1], id, id) == 0 then
      -- Trimmed or deleted while we work on it (XADD MAXLEN): XCLAIM would
      -- drop it from the PEL and nothing could ever redeliver it. It is
      -- still ours; the body is in our memory and the ledger lease fences us.
      owned[#owned + 1] = id
    else
      local c = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id, 'JUSTID')
      if #c == 1 then
        owned[#owned + 1] = id
      end
    end
  end
end
return owned

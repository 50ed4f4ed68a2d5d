-- trim.lua: trim one stream to the oldest entry a consumer group on it may
-- still need, and never past the retention. The bound and the trim are one
-- atomic step: read apart, a group could read or be created between the two
-- and the trim would remove what it was just handed.
--
-- The bound is the lowest of:
--   * the retention: ARGV[2], "<now − retention in ms>-0" (entry ids are
--     millisecond timestamps);
--   * every group's last-delivered-id (pelguard's group and any other):
--     entries after it are unread by that group; the last delivered entry
--     itself is kept too, which costs one entry and needs no id arithmetic;
--   * every group's lowest pending id (XPENDING's summary): a pending entry
--     is not done until its consumer acks it.
-- XTRIM MINID removes entries whose id is strictly below the bound, and
-- with "~" only whole radix-tree nodes, so it never removes more than the
-- exact trim would.
--
-- XINFO GROUPS and XPENDING are allowed in scripts on Redis 7.0 and later
-- (and Valkey 7.2 and later): neither is flagged noscript.
--
-- KEYS[1]  the stream
-- ARGV[1]  the group pelguard tends on it: when it does not exist, nothing
--          is trimmed (a group recreated at 0 after a loss still finds
--          everything the retention kept)
-- ARGV[2]  the retention bound, "<ms>-0"
-- ARGV[3]  XTRIM's LIMIT: at most this many entries removed by one call,
--          so one call never blocks Redis for long
--
-- Returns {removed, bound, length, why}: the entries removed, the MINID
-- used ("" when nothing was trimmed), XLEN after, and "trimmed",
-- "no_stream" or "no_group".
-- One key only, so the script runs on any Redis Cluster slot.

local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end

local function below(a, b) -- a < b, both "ms-seq"
  local am, as = parse(a)
  local bm, bs = parse(b)
  return am < bm or (am == bm and as < bs)
end

if redis.call('EXISTS', KEYS[1]) == 0 then
  return {0, '', 0, 'no_stream'}
end

local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
local bound = ARGV[2]
local ours = false
for _, g in ipairs(groups) do
  local name, last
  for i = 1, #g, 2 do
    if g[i] == 'name' then
      name = g[i + 1]
    elseif g[i] == 'last-delivered-id' then
      last = g[i + 1]
    end
  end
  if name == ARGV[1] then
    ours = true
  end
  if below(last, bound) then
    bound = last
  end
  local p = redis.call('XPENDING', KEYS[1], name)
  if p[1] > 0 and below(p[2], bound) then
    bound = p[2]
  end
end

if not ours then
  return {0, '', redis.call('XLEN', KEYS[1]), 'no_group'}
end

local removed = redis.call('XTRIM', KEYS[1], 'MINID', '~', bound, 'LIMIT', tonumber(ARGV[3]))
return {removed, bound, redis.call('XLEN', KEYS[1]), 'trimmed'}

-- claim: which job writes to an outputDir. One key per outputDir, so the script touches a
-- single slot (Redis Cluster) and two jobs of different shards, on different replicas, meet
-- here.
--
-- KEYS[1] claim   {P}:claim:<digest of the outputDir>   string "<job rkey>|<claimed at ms>"
--
-- ARGV[1] mode    "claim" | "release"
-- ARGV[2] job     the job's rkey
-- ARGV[3] now_ms  the caller's clock
-- ARGV[4] stale   "" or the holder the caller found stale (its job gone or moved elsewhere)
-- ARGV[5] grace   ms: a claim younger than this is never taken as stale (its job's first
--                 commit may still be on its way)
--
-- claim: returns nil when the job holds the claim now (taken, kept or taken over from the
-- stale holder), else the holder's rkey. release: deletes the claim if the job holds it;
-- returns 1 if it did, 0 otherwise.

local value = redis.call('GET', KEYS[1])
local holder, since = nil, 0
if value then
  holder, since = string.match(value, '^(.*)|(%d+)$')
  since = tonumber(since) or 0
end

if ARGV[1] == 'release' then
  if holder == ARGV[2] then
    redis.call('DEL', KEYS[1])
    return 1
  end
  return 0
end

local now = tonumber(ARGV[3])
local taken_over = ARGV[4] ~= '' and holder == ARGV[4] and now - since > tonumber(ARGV[5])
if not holder or holder == ARGV[2] or taken_over then
  redis.call('SET', KEYS[1], ARGV[2] .. '|' .. ARGV[3])
  return false
end
return holder

-- claim: which job writes to an outputDir. Claims are fields of 256 hashes (picked by the
-- digest of the outputDir), so the script touches a single slot (Redis Cluster) and two jobs
-- of different shards, on different replicas, meet here.
--
-- KEYS[1] claims  {P}:claims:<first two hex digits of the digest>   hash
--
-- ARGV[1] field   the digest of the outputDir; its value "<job rkey>|<claimed at ms>"
-- ARGV[2] mode    "claim" | "release"
-- ARGV[3] job     the job's rkey
-- ARGV[4] now_ms  the caller's clock
-- ARGV[5] stale   "" or the holder the caller found stale (its job gone or moved elsewhere)
-- ARGV[6] grace   ms: a claim younger than this is never taken as stale (its job's first
--                 commit may still be on its way)
--
-- claim: returns nil when the job holds the claim now (taken, kept or taken over from the
-- stale holder), else the holder's rkey. release: deletes the claim if the job holds it;
-- returns 1 if it did, 0 otherwise.

local value = redis.call('HGET', KEYS[1], ARGV[1])
local holder, since = nil, 0
if value then
  holder, since = string.match(value, '^(.*)|(%d+)$')
  since = tonumber(since) or 0
end

if ARGV[2] == 'release' then
  if holder == ARGV[3] then
    redis.call('HDEL', KEYS[1], ARGV[1])
    return 1
  end
  return 0
end

local now = tonumber(ARGV[4])
local taken_over = ARGV[5] ~= '' and holder == ARGV[5] and now - since > tonumber(ARGV[6])
if not holder or holder == ARGV[3] or taken_over then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3] .. '|' .. ARGV[4])
  return false
end
return holder

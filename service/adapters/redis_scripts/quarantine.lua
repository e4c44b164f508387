-- quarantine: set or clear a resource's quarantine mark and take entries out of the ingress
-- stream (acknowledged and deleted: their records went to the dead-letter stream), fenced by
-- the shard lease.
--
-- KEYS[1] lease     {P}:{s<N>}:lease      string "<replica>:<fence>"
-- KEYS[2] broken    {P}:{s<N>}:broken     hash rkey -> quarantine mark (JSON)
-- KEYS[3] ingress   {P}:{s<N>}:ingress    stream with consumer group ARGV[2]
-- KEYS[4] timers    {P}:{s<N>}:timers     zset rkey -> due ms
--
-- ARGV[1] token     the lease token the caller holds
-- ARGV[2] ingress consumer group
-- ARGV[3] rkey      the resource ("" when the entries' resource is unknown)
-- ARGV[4] mode      "set" | "clear" | "" (leave the mark as it is)
-- ARGV[5] mark      the mark, when the mode is "set"
-- ARGV[6] retry     "" or the ms at which the resource is tried again (a timer for rkey)
-- ARGV[7...]        ingress entry ids to take out
--
-- Returns the number of entries taken out; error "FENCED" when KEYS[1] does not hold
-- ARGV[1] (then nothing is written).

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('FENCED shard lease not held by this token')
end

local rkey = ARGV[3]
if rkey ~= '' then
  if ARGV[4] == 'set' then
    redis.call('HSET', KEYS[2], rkey, ARGV[5])
  elseif ARGV[4] == 'clear' then
    redis.call('HDEL', KEYS[2], rkey)
  end
  if ARGV[6] ~= '' then
    redis.call('ZADD', KEYS[4], ARGV[6], rkey)
  end
end

local n = #ARGV - 6
if n > 0 then
  local ids = {}
  for k = 1, n do
    ids[k] = ARGV[k + 6]
  end
  redis.call('XACK', KEYS[3], ARGV[2], unpack(ids))
  redis.call('XDEL', KEYS[3], unpack(ids))
end
return n

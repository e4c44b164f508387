-- commit: apply one resource's transition atomically, fenced by the shard lease.
--
-- KEYS[1] lease     {P}:{s<N>}:lease            string "<replica>:<fence>"
-- KEYS[2] state     {P}:{s<N>}:state:<rkey>     string
-- KEYS[3] resource  {P}:{s<N>}:resource:<rkey>  string
-- KEYS[4] history   {P}:{s<N>}:history:<rkey>   list, capped (a list: a small stream costs ~4 KiB)
-- KEYS[5] timers    {P}:{s<N>}:timers           zset rkey -> due ms
-- KEYS[6] effects   {P}:{s<N>}:effects          hash effect id -> intent
-- KEYS[7] index     {P}:{s<N>}:index            set of rkeys with state
-- KEYS[8] outbox    {P}:{s<N>}:outbox           stream, fields id/topic/payload
-- KEYS[9] ingress   {P}:{s<N>}:ingress          stream with consumer group ARGV[8]
-- KEYS[10] gm       {P}:{s<N>}:gm-outbox        stream, fields id/payload (for the GM link)
-- KEYS[11] rounds   {P}:{s<N>}:rounds:<rkey>    list, capped: a job's round records
--
-- ARGV[1]  token           the lease token the commit was computed under
-- ARGV[2]  rkey            member of timers and index
-- ARGV[3]  state mode      "set" | "delete" | "keep"
-- ARGV[4]  state bytes     used when the mode is "set"
-- ARGV[5]  resource mode   "set" | "keep"
-- ARGV[6]  resource bytes  used when the mode is "set"
-- ARGV[7]  timer           "" unchanged | "-1" cancel | due ms
-- ARGV[8]  ingress consumer group
-- ARGV[9]  history length kept
-- ARGV[10] n_ack   ARGV[11] n_outbox   ARGV[12] n_effects   ARGV[13] n_history   ARGV[14] n_gm
-- ARGV[15] n_rounds   ARGV[16] round records kept   ARGV[17] n_retire
-- ARGV[18...] n_ack ingress ids, then n_outbox (id, topic, payload) triples, then
--             n_effects (effect id, bytes) pairs, then n_history entries, then n_gm
--             (id, payload) pairs, then n_rounds round records, then n_retire effect ids
--
-- Retired effect ids are the intents whose results this commit applies (handed over in
-- process by the replica that ran them, under this same lease token): deleting them here,
-- in the transaction that applies their results, is what makes a result apply exactly once
-- (a crash before this commit leaves the intent pending for the next owner to redo).
--
-- Every check happens before the first write, so a refused commit writes nothing.
-- Returns the outbox stream ids of the entries added, in order (so the caller can publish
-- them at once and delete them after PUBACK without reading the outbox back); error
-- "FENCED" when KEYS[1] does not hold ARGV[1].

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('FENCED shard lease not held by this token')
end

local rkey = ARGV[2]
local mode = ARGV[3]
if mode == 'set' then
  redis.call('SET', KEYS[2], ARGV[4])
  redis.call('SADD', KEYS[7], rkey)
elseif mode == 'delete' then
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[11])
  redis.call('ZREM', KEYS[5], rkey)
  redis.call('SREM', KEYS[7], rkey)
end

if mode ~= 'delete' then
  if ARGV[5] == 'set' then
    redis.call('SET', KEYS[3], ARGV[6])
  end
  if ARGV[7] == '-1' then
    redis.call('ZREM', KEYS[5], rkey)
  elseif ARGV[7] ~= '' then
    redis.call('ZADD', KEYS[5], ARGV[7], rkey)
  end
end

local n_ack = tonumber(ARGV[10])
local n_outbox = tonumber(ARGV[11])
local n_effects = tonumber(ARGV[12])
local n_history = tonumber(ARGV[13])
local n_gm = tonumber(ARGV[14])
local n_rounds = tonumber(ARGV[15])
local n_retire = tonumber(ARGV[17])
local i = 18

if n_ack > 0 then
  local ids = {}
  for k = 1, n_ack do
    ids[k] = ARGV[i]
    i = i + 1
  end
  -- acknowledged entries are done: drop them so the ingress stream holds only open work
  redis.call('XACK', KEYS[9], ARGV[8], unpack(ids))
  redis.call('XDEL', KEYS[9], unpack(ids))
end

local outbox_ids = {}
for k = 1, n_outbox do
  outbox_ids[k] = redis.call('XADD', KEYS[8], '*', 'id', ARGV[i], 'topic', ARGV[i + 1],
    'payload', ARGV[i + 2])
  i = i + 3
end

for _ = 1, n_effects do
  redis.call('HSET', KEYS[6], ARGV[i], ARGV[i + 1])
  i = i + 2
end

if n_history > 0 then
  for _ = 1, n_history do
    if mode ~= 'delete' then
      redis.call('RPUSH', KEYS[4], ARGV[i])
    end
    i = i + 1
  end
  if mode ~= 'delete' then
    redis.call('LTRIM', KEYS[4], -tonumber(ARGV[9]), -1)
  end
end

for _ = 1, n_gm do
  redis.call('XADD', KEYS[10], '*', 'id', ARGV[i], 'payload', ARGV[i + 1])
  i = i + 2
end

if n_rounds > 0 and mode ~= 'delete' then
  for _ = 1, n_rounds do
    redis.call('RPUSH', KEYS[11], ARGV[i])
    i = i + 1
  end
  redis.call('LTRIM', KEYS[11], -tonumber(ARGV[16]), -1)
end
if n_rounds > 0 and mode == 'delete' then
  i = i + n_rounds
end

for _ = 1, n_retire do
  redis.call('HDEL', KEYS[6], ARGV[i])
  i = i + 1
end

return outbox_ids

-- commit: apply the transitions of one shard's resources atomically, fenced by the shard
-- lease, in one script run (one lease check and one acknowledgement for all of them).
--
-- KEYS[1] lease     {P}:{s<N>}:lease            string "<replica>:<fence>"
-- KEYS[2] timers    {P}:{s<N>}:timers           zset rkey -> due ms
-- KEYS[3] effects   {P}:{s<N>}:effects          hash effect id -> intent
-- KEYS[4] index     {P}:{s<N>}:index            set of rkeys with state
-- KEYS[5] outbox    {P}:{s<N>}:outbox           stream, fields id/topic/payload
-- KEYS[6] ingress   {P}:{s<N>}:ingress          stream with consumer group ARGV[2]
-- KEYS[7] gm        {P}:{s<N>}:gm-outbox        stream, fields id/payload (for the GM link)
-- then 4 keys per resource, in the order of the resources' sections below:
--   state {P}:{s<N>}:state:<rkey> string; resource {P}:{s<N>}:resource:<rkey> string;
--   history {P}:{s<N>}:history:<rkey> list, capped (a list: a small stream costs ~4 KiB);
--   rounds {P}:{s<N>}:rounds:<rkey> list, capped: a job's round records
-- then one dedupe marker key {P}:{s<N>}:seen:<digest> per message taken in by this commit.
--
-- ARGV[1] token             the lease token the commit was computed under
-- ARGV[2] ingress consumer group
-- ARGV[3] history length kept     ARGV[4] round records kept
-- ARGV[5] n_resources       ARGV[6] n_ack (ingress entry ids this commit acknowledges)
-- ARGV[7] n_markers         ARGV[8] the ingress lease token the messages were taken in under
-- ARGV[9] marker time-to-live in ms
-- ARGV[10...] n_ack ingress ids, then per marker "1" when its message came flagged as a
--   redelivery (MQTT DUP) else "0", then one section per resource:
--   rkey, state mode ("set" | "keep" | "delete"), state bytes, resource mode
--   ("keep" | "set"), resource bytes, timer ("" unchanged | "-1" cancel | due ms),
--   n_outbox, n_effects, n_history, n_gm, n_rounds, n_retire, then n_outbox (id, topic,
--   payload) triples, n_effects (effect id, bytes) pairs, n_history entries, n_gm (id,
--   payload) pairs, n_rounds round records and n_retire effect ids.
--
-- State modes: "set" stores the state (and indexes a resource that had none), "keep" leaves
-- it as it is (nothing in it changed), "delete" removes state, resource, timer, histories
-- and index membership.
--
-- Markers: messages handed straight from the intake to this commit, never appended to the
-- ingress stream. A message is known when its marker exists and either it is a redelivery or
-- the marker was set under another ingress token (a holder frozen past its lease still has
-- in hand, as a first delivery, messages the broker already redelivered to the new holder):
-- then nothing is written (a marker it set is taken back) and error "DUPLICATE i j ..." names
-- the known markers (1-based), for the caller to drop those messages and commit again.
-- Otherwise every marker is set (or its time-to-live renewed) under the token.
--
-- Retired effect ids are the intents whose results this commit applies (handed over in
-- process by the replica that ran them, under this same lease token): deleting them here,
-- in the transaction that applies their results, is what makes a result apply exactly once
-- (a crash before this commit leaves the intent pending for the next owner to redo).
--
-- Every check happens before the first write (the markers' own are undone when they
-- refuse), so a refused commit writes nothing.
-- Returns, per resource, the outbox stream ids of the entries added, in order (so the
-- caller can publish them at once and delete them after PUBACK without reading the outbox
-- back); error "FENCED" when KEYS[1] does not hold ARGV[1].

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('FENCED shard lease not held by this token')
end

local n_resources = tonumber(ARGV[5])
local n_ack = tonumber(ARGV[6])
local n_markers = tonumber(ARGV[7])
local marker_token = ARGV[8]
local first_marker = 8 + 4 * n_resources
local i = 10

local acks = {}
for k = 1, n_ack do
  acks[k] = ARGV[i]
  i = i + 1
end

local created = {}  -- markers set by this commit, taken back if it is refused
local renewed = {}  -- markers already set under this token, for a first delivery
local known = {}
for k = 1, n_markers do
  local key = KEYS[first_marker + k - 1]
  if redis.call('SET', key, marker_token, 'NX', 'PX', ARGV[9]) then
    created[#created + 1] = key
  else
    local marker = redis.call('GET', key)
    if marker and (ARGV[i] == '1' or marker ~= marker_token) then
      known[#known + 1] = tostring(k)
    else
      renewed[#renewed + 1] = key
    end
  end
  i = i + 1
end
if #known > 0 then
  if #created > 0 then
    redis.call('DEL', unpack(created))
  end
  return redis.error_reply('DUPLICATE ' .. table.concat(known, ' '))
end
for _, key in ipairs(renewed) do
  redis.call('SET', key, marker_token, 'PX', ARGV[9])
end

if n_ack > 0 then
  -- acknowledged entries are done: drop them so the ingress stream holds only open work
  redis.call('XACK', KEYS[6], ARGV[2], unpack(acks))
  redis.call('XDEL', KEYS[6], unpack(acks))
end

-- the items of ARGV from i on, n of them, as a list
local function take(n)
  local items = {}
  for k = 1, n do
    items[k] = ARGV[i]
    i = i + 1
  end
  return items
end

-- append to a capped list: one push, a trim only once the list outgrew its cap
local function push(key, items, kept)
  if #items > 0 and redis.call('RPUSH', key, unpack(items)) > kept then
    redis.call('LTRIM', key, -kept, -1)
  end
end

local history_kept = tonumber(ARGV[3])
local rounds_kept = tonumber(ARGV[4])
local all_ids = {}
for r = 1, n_resources do
  local state_key, resource_key = KEYS[4 + 4 * r], KEYS[5 + 4 * r]
  local history_key, rounds_key = KEYS[6 + 4 * r], KEYS[7 + 4 * r]
  local rkey, mode = ARGV[i], ARGV[i + 1]
  local state, resource_mode, resource, timer = ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
  local n_outbox, n_effects = tonumber(ARGV[i + 6]), tonumber(ARGV[i + 7])
  local n_history, n_gm = tonumber(ARGV[i + 8]), tonumber(ARGV[i + 9])
  local n_rounds, n_retire = tonumber(ARGV[i + 10]), tonumber(ARGV[i + 11])
  i = i + 12

  if mode == 'set' then
    if not redis.call('SET', state_key, state, 'GET') then
      redis.call('SADD', KEYS[4], rkey)  -- a resource with state for the first time
    end
  elseif mode == 'delete' then
    redis.call('DEL', state_key, resource_key, history_key, rounds_key)
    redis.call('ZREM', KEYS[2], rkey)
    redis.call('SREM', KEYS[4], rkey)
  end
  if mode ~= 'delete' then
    if resource_mode == 'set' then
      redis.call('SET', resource_key, resource)
    end
    if timer == '-1' then
      redis.call('ZREM', KEYS[2], rkey)
    elseif timer ~= '' then
      redis.call('ZADD', KEYS[2], timer, rkey)
    end
  end

  local ids = {}
  for k = 1, n_outbox do
    ids[k] = redis.call('XADD', KEYS[5], '*', 'id', ARGV[i], 'topic', ARGV[i + 1],
      'payload', ARGV[i + 2])
    i = i + 3
  end
  all_ids[r] = ids

  if n_effects > 0 then
    redis.call('HSET', KEYS[3], unpack(take(2 * n_effects)))
  end
  local history = take(n_history)
  if mode ~= 'delete' then
    push(history_key, history, history_kept)
  end
  for _ = 1, n_gm do
    redis.call('XADD', KEYS[7], '*', 'id', ARGV[i], 'payload', ARGV[i + 1])
    i = i + 2
  end
  local rounds = take(n_rounds)
  if mode ~= 'delete' then
    push(rounds_key, rounds, rounds_kept)
  end
  if n_retire > 0 then
    redis.call('HDEL', KEYS[3], unpack(take(n_retire)))
  end
end

return all_ids

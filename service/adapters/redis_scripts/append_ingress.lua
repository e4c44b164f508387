-- append_ingress: take events into one shard's ingress stream, dropping known redeliveries.
--
-- KEYS[1] ingress  {P}:{s<N>}:ingress        stream, field e
-- KEYS[2...]       {P}:{s<N>}:seen:<digest>  dedupe markers of the events that have one
--
-- ARGV[1] the taker's ingress lease token ("" when none)
-- ARGV[2] marker time-to-live in ms
-- ARGV[3...] per event: its bytes, "1" when the transport flagged the message as a
--            redelivery (MQTT DUP) else "0", and the index in KEYS of its marker ("0": none)
--
-- The marker holds the token of the ingress holder that took the message in. A message is
-- known, and dropped (false in its place, marker's time-to-live renewed), when its marker
-- exists and either it is a redelivery (DUP) or the marker was set under another token: a
-- holder frozen past its lease still has in hand, as a first delivery, messages the broker
-- already redelivered to the new holder. Otherwise the marker is set (or renewed) and the
-- new entry id takes its place: a first delivery under the same token is always appended,
-- two distinct messages may share a key.

local token, ttl = ARGV[1], ARGV[2]
local ids = {}
for i = 3, #ARGV, 3 do
  local appended = true
  if ARGV[i + 2] ~= '0' then
    local key = KEYS[tonumber(ARGV[i + 2])]
    if not redis.call('SET', key, token, 'NX', 'PX', ttl) then
      local marker = redis.call('GET', key)
      if marker and (ARGV[i + 1] == '1' or marker ~= token) then
        redis.call('PEXPIRE', key, ttl)
        appended = false
      else
        redis.call('SET', key, token, 'PX', ttl)
      end
    end
  end
  if appended then
    ids[#ids + 1] = redis.call('XADD', KEYS[1], '*', 'e', ARGV[i])
  else
    ids[#ids + 1] = false
  end
end
return ids

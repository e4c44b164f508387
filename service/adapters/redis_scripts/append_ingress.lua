-- append_ingress: take one event into a shard's ingress stream, dropping known redeliveries.
--
-- KEYS[1] ingress  {P}:{s<N>}:ingress        stream, field e
-- KEYS[2] seen     {P}:{s<N>}:seen:<digest>  dedupe marker (absent when no dedupe key)
--
-- ARGV[1] event bytes
-- ARGV[2] "1" when the transport flagged the message as a redelivery (MQTT DUP), else "0"
-- ARGV[3] marker time-to-live in ms
-- ARGV[4] the taker's ingress lease token ("" when none)
--
-- The marker holds the token of the ingress holder that took the message in. A message is
-- known, and dropped (nil returned, marker refreshed), when its marker exists and either it
-- is a redelivery (DUP) or the marker was set under another token: a holder frozen past its
-- lease still has in hand, as a first delivery, messages the broker already redelivered to
-- the new holder. Otherwise the marker is (re)set and the new entry id returned: a first
-- delivery under the same token is always appended, two distinct messages may share a key.

if #KEYS == 2 then
  local marker = redis.call('GET', KEYS[2])
  redis.call('SET', KEYS[2], marker or ARGV[4], 'PX', ARGV[3])
  if marker and (ARGV[2] == '1' or marker ~= ARGV[4]) then
    return false
  end
end
return redis.call('XADD', KEYS[1], '*', 'e', ARGV[1])

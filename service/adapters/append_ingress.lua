-- append_ingress: take one event into a shard's ingress stream, dropping known redeliveries.
--
-- KEYS[1] ingress  {P}:{s<N>}:ingress        stream, field e
-- KEYS[2] seen     {P}:{s<N>}:seen:<digest>  dedupe marker (absent when no dedupe key)
--
-- ARGV[1] event bytes
-- ARGV[2] "1" when the transport flagged the message as a redelivery (MQTT DUP), else "0"
-- ARGV[3] marker time-to-live in ms
--
-- A redelivery whose marker exists was already taken in: refresh the marker, append nothing
-- and return nil. Otherwise (re)set the marker and return the new entry id. A first delivery
-- is always appended, even with the marker present: two distinct messages may share a key.

if #KEYS == 2 then
  local known = redis.call('EXISTS', KEYS[2]) == 1
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[3])
  if known and ARGV[2] == '1' then
    return false
  end
end
return redis.call('XADD', KEYS[1], '*', 'e', ARGV[1])

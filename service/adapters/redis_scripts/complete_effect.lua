-- complete_effect: retire an effect intent and feed its result back as an event, once.
--
-- KEYS[1] lease    {P}:{s<N>}:lease    string "<replica>:<fence>"
-- KEYS[2] effects  {P}:{s<N>}:effects  hash effect id -> intent
-- KEYS[3] ingress  {P}:{s<N>}:ingress  stream, field e
--
-- ARGV[1] token       the caller's lease token
-- ARGV[2] effect id
-- ARGV[3] "1" when a result event follows, else "0"
-- ARGV[4] result event bytes
--
-- Returns 1 when the intent was pending (and the event, if any, was appended), 0 when it was
-- already completed; error "FENCED" when KEYS[1] does not hold ARGV[1].

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('FENCED shard lease not held by this token')
end

if redis.call('HDEL', KEYS[2], ARGV[2]) == 0 then
  return 0
end
if ARGV[3] == '1' then
  redis.call('XADD', KEYS[3], '*', 'e', ARGV[4])
end
return 1

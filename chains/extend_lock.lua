-- KEYS: 1 lock; ARGV: 1 token, 2 ttl ms. Extends the lock if it is still ours, takes it again
-- if it expired and nobody took it; 0 if another holds it.
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] or not v then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0

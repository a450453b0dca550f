-- A task of a paused run, at its begin: back to the run's waiting list instead of running.
-- KEYS: 1 run hash, 2 counters, 3 pending, 4 ledger, 5 done set, 6 deliveries key, 7 parked
--       set (task ids parked since the last resume: a redelivery is not parked twice)
-- ARGV: 1 tid, 2 message (`Kid.encode()` form), 3 ttl, 4 '1': this delivery was counted
-- Reply: 1 parked (or already), 0 not paused (resumed meanwhile, or cancelled: run the task
-- as usual), -1 committed meanwhile by another delivery
local rh = redis.call('HMGET', KEYS[1], 'paused', 'cancelled', 'cap')
if not rh[1] or rh[2] then return 0 end
if redis.call('SISMEMBER', KEYS[5], ARGV[1]) == 1 then return -1 end
if ARGV[4] == '1' and tonumber(redis.call('GET', KEYS[6]) or '0') > 0 then
  redis.call('DECR', KEYS[6])  -- parking is no delivery: a poison cap must not count it
end
if redis.call('SADD', KEYS[7], ARGV[1]) == 0 then return 1 end
redis.call('EXPIRE', KEYS[7], tonumber(ARGV[3]))
redis.call('RPUSH', KEYS[3], ARGV[2])
redis.call('HDEL', KEYS[1], 'nowait')  -- it waits now (commit.lua reads no LLEN with it)
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[3]))
redis.call('HSET', KEYS[4], ARGV[1], ARGV[2])
if tonumber(rh[3] or '0') > 0 then redis.call('HINCRBY', KEYS[2], 'inflight', -1) end
return 1

--[[ Take the production flag of a pool (external_interface/resources/pool.py, Pool.try_start_production):
at most one production run per pool at a time across all workers, and a least gap between two.

KEYS  1 producing ("<run id> <produced count when it started>", or absent)  2 produce_gap
ARGV  1 the flag the caller saw ('' = none)  2 the new flag  3 its ttl (ms)  4 gap (ms, 0 = none)
-> 1 taken, 0 another worker changed the flag first, or the gap is not over
]]
local cur = redis.call('GET', KEYS[1]) or ''
if cur ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', tonumber(ARGV[3]))
if tonumber(ARGV[4]) > 0 then redis.call('SET', KEYS[2], '1', 'PX', tonumber(ARGV[4])) end
return 1

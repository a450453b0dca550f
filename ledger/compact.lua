-- Compact a finished run to its summary: once it is done (or cancelled) with nothing
-- outstanding and every item stored (or refused by a sink), its per-task bookkeeping goes
-- and the run hash and counters stay for the retention.
-- KEYS: 1 run hash, 2 counters, then the bookkeeping to drop (done set, parked set, waiting
--       list, the `unique` sets)
-- ARGV: 1 now, 2 retention (seconds)
-- Reply: 1 compacted now, 0 not (yet, or already)
local st = redis.call('HMGET', KEYS[1], 'status', 'compacted')
if not st[1] or st[2] then return 0 end
if st[1] ~= 'done' and st[1] ~= 'cancelled' then return 0 end
local c = redis.call('HMGET', KEYS[2], 'outstanding', 'items', 'stored', 'store_failed')
if tonumber(c[1] or '0') > 0 then return 0 end
if tonumber(c[3] or '0') + tonumber(c[4] or '0') < tonumber(c[2] or '0') then return 0 end
redis.call('HSET', KEYS[1], 'compacted', ARGV[1])
for k = 3, #KEYS do redis.call('UNLINK', KEYS[k]) end
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1

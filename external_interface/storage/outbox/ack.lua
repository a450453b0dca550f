-- Acknowledge a stored batch: XACK each entry, and only for the ones this drainer won
-- (XACK returned 1) XDEL it (one XDEL for all), copy a dead letter, and add its items to
-- the counters.
-- KEYS: 1 stream, 2 dead-letter stream, 3.. counters hashes and metric hashes; a run's
--       counters are followed by its wake list (utils/wake.lua), which the script pushes
--       'e' to once every task of the run has committed and the last item has settled (its
--       `wait()` returns at once) and 'p' for a batch stored before that, when its tasks are
--       done (the run is `storing`)
-- ARGV: 1 group, 2 counters ttl, 3 dead maxlen, then per entry:
--       id, counters key index (0: no run), step, n items, counter field,
--       task metrics key index, site metrics key index, n dead fields, fields...
-- include: ../../../utils/wake.lua
local group, ttl, maxlen = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local i, won = 4, 0
-- counts are summed per key and field and written once per call (a drain's entries share a
-- few runs and endpoints): key index -> {field -> n}, key indexes in first-seen order
local sums, order, runs, gone = {}, {}, {}, {}
local function add(idx, field, n)
  local t = sums[idx]
  if t == nil then t = {}; sums[idx] = t; order[#order + 1] = idx end
  t[field] = (t[field] or 0) + n
end
while i <= #ARGV do
  local id, kidx, step, n, cfield = ARGV[i], tonumber(ARGV[i+1]), ARGV[i+2],
    tonumber(ARGV[i+3]), ARGV[i+4]
  local tidx, sidx, nf = tonumber(ARGV[i+5]), tonumber(ARGV[i+6]), tonumber(ARGV[i+7])
  local first = i + 8
  i = first + nf
  if redis.call('XACK', KEYS[1], group, id) == 1 then
    won = won + 1
    gone[won] = id  -- deleted with one XDEL at the end, a few thousand ids a call
    if nf > 0 then
      redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', unpack(ARGV, first, first + nf - 1))
    end
    if kidx > 0 and n > 0 then
      runs[kidx] = true
      add(kidx, step .. ':' .. cfield, n)
      add(kidx, cfield, n)
    end
    if n > 0 and tidx > 0 then
      add(tidx, cfield, n)
      add(sidx, cfield, n)
    end
  end
end
for a = 1, #gone, 4000 do
  redis.call('XDEL', KEYS[1], unpack(gone, a, math.min(a + 3999, #gone)))
end
for _, idx in ipairs(order) do
  local key = KEYS[idx]
  local fresh = runs[idx] and redis.call('EXISTS', key) == 0  -- a run's counters outlived
  for field, n in pairs(sums[idx]) do redis.call('HINCRBY', key, field, n) end
  if fresh then redis.call('EXPIRE', key, ttl) end
  if runs[idx] and not fresh then
    local c = redis.call('HMGET', key, 'outstanding', 'items', 'stored', 'store_failed')
    if tonumber(c[1] or '1') <= 0 then  -- its tasks are done: storing, or now settled
      local settled = tonumber(c[2] or '0') <= tonumber(c[3] or '0') + tonumber(c[4] or '0')
      wake_list(KEYS[idx + 1], settled and 'e' or 'p')
    end
  end
end
return won

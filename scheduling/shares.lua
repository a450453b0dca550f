-- The fleet budget's weighted fair share of one dimension (tasks in flight, leases of a kind).
-- KEYS: 1 alloc (hash: site -> its share now, x1000), then per site i: held_i (zset holder ->
--       expiry us), want_i (zset holder -> expiry us: refused, still asking)
-- ARGV: 1 op (take | give | view), 2 the asking site's index (1-based; 0 for view),
--       3 holder, 4 hold ttl (us), 5 want ttl (us), 6 capacity, 7 sites,
--       then per site: name, weight, priority
-- take -> {1 admitted | 0 refused, the site's share x1000, held by the site, held in all}
-- give -> {1}; view -> per site {held, want, share x1000}
--
-- Shares water-fill the capacity: each site with demand (held + waiting) first gets up to its
-- nominal share (capacity x weight / all weights, whether or not the others are busy); what is
-- left goes to the sites whose demand is not met, the highest priority first, by weight within
-- a priority, each up to its demand. So an idle site's share serves the busy ones (work
-- conserving) and comes back to it as soon as it asks: a site over its share takes nothing new
-- until its tasks finish.
local op, me, holder = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local ttl, want_ttl, cap, n = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local w, prio, held, want, demand = {}, {}, {}, {}, {}
for i = 1, n do
  w[i], prio[i] = tonumber(ARGV[6 + 3 * i]), tonumber(ARGV[7 + 3 * i])
end
if op == 'give' then
  redis.call('ZREM', KEYS[2 * me], holder)
  redis.call('ZREM', KEYS[2 * me + 1], holder)
  return {1}
end
local total, wsum = 0, 0
for i = 1, n do
  redis.call('ZREMRANGEBYSCORE', KEYS[2 * i], '-inf', fmt(now))
  redis.call('ZREMRANGEBYSCORE', KEYS[2 * i + 1], '-inf', fmt(now))
  held[i] = redis.call('ZCARD', KEYS[2 * i])
  want[i] = redis.call('ZCARD', KEYS[2 * i + 1])
  demand[i] = held[i] + want[i]
  total = total + held[i]
  wsum = wsum + w[i]
end
local holding = false
if op == 'take' then
  holding = redis.call('ZSCORE', KEYS[2 * me], holder) ~= false
  if not holding and not redis.call('ZSCORE', KEYS[2 * me + 1], holder) then
    demand[me] = demand[me] + 1
  end
end
-- water-fill
local alloc, spare = {}, cap
for i = 1, n do
  alloc[i] = math.min(demand[i], cap * w[i] / wsum)
  spare = spare - alloc[i]
end
local levels = {}
for i = 1, n do levels[prio[i]] = true end
local order = {}
for p in pairs(levels) do order[#order + 1] = p end
table.sort(order, function(a, b) return a > b end)
for _, p in ipairs(order) do
  while spare > 1e-9 do
    local open, wo = {}, 0
    for i = 1, n do
      if prio[i] == p and demand[i] - alloc[i] > 1e-9 then
        open[#open + 1] = i
        wo = wo + w[i]
      end
    end
    if #open == 0 then break end
    local full = {}
    for _, i in ipairs(open) do
      if spare * w[i] / wo >= demand[i] - alloc[i] then full[#full + 1] = i end
    end
    if #full == 0 then
      for _, i in ipairs(open) do alloc[i] = alloc[i] + spare * w[i] / wo end
      spare = 0
    else
      for _, i in ipairs(full) do
        spare = spare - (demand[i] - alloc[i])
        alloc[i] = demand[i]
      end
    end
  end
end
local fields = {}
for i = 1, n do
  fields[#fields + 1] = ARGV[5 + 3 * i]
  fields[#fields + 1] = fmt(alloc[i] * 1000)
end
redis.call('HSET', KEYS[1], 'at', fmt(now), unpack(fields))
if op == 'view' then
  local out = {}
  for i = 1, n do out[i] = {held[i], want[i], math.floor(alloc[i] * 1000 + 0.5)} end
  return out
end
local key_held, key_want = KEYS[2 * me], KEYS[2 * me + 1]
local ok = holding or (held[me] < alloc[me] - 1e-9 and total < cap)
if ok then
  redis.call('ZADD', key_held, fmt(now + ttl), holder)
  redis.call('PEXPIRE', key_held, math.ceil(ttl / 1000) + 60000)
  redis.call('ZREM', key_want, holder)
  if not holding then held[me] = held[me] + 1; total = total + 1 end
else
  redis.call('ZADD', key_want, fmt(now + want_ttl), holder)
  redis.call('PEXPIRE', key_want, math.ceil(want_ttl / 1000) + 60000)
end
return {ok and 1 or 0, math.floor(alloc[me] * 1000 + 0.5), held[me], total}

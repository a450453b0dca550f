--[[ The lease engine: members of one pool lent exclusively, with use counts, a health score,
cool-down, retirement and a bench. Key layout and the callers: external_interface/resources/lease.py.

lease.py puts the pool's profile in front of this source, as constants (so they cost no
argument on the page path):
  ORDER     'lru': the idle score is "ready at" (ms), the member idle longest goes first;
            'uses': the idle score is the use count (always <= now: always ready), the least
            used goes first; a cool-down (`rest_ms` of a use) is spent in :lease without a
            token (not lent, not idle) and the prologue puts the member back to idle
  LOST      a lease that ends without its holder's return (reclaimed on expiry, or returned
            after that) still counts as a use
  SCORED    members carry a health score
  PRODUCED  the pool is refilled by production when it runs low: checkout and release report
            its size, and checkouts are counted

Every operation first reads the server time and reclaims up to RECLAIM leases that expired
(their holder died), so lease times never depend on a worker's clock and a dead holder's
member comes back by itself.

KEYS   1 idle  2 lease  3 token  4 uses  5 score  6 secret  7 stats  8 retired  9 ban
       10 (op add only, optional) source zset: only its members may be added
       (all of one pool, under its site's hash tag: one Redis Cluster slot; a source must share
       it, so on a cluster the proxy channel's refill passes none: proxy/channel.py)
ARGV   1 the operation: checkout | release | add | retire | sizes | reclaim; then its
       arguments, documented at each operation below

The hot path (checkout, release) creates no Lua closure: each costs about as much as a few
Redis commands, so helpers are written out and every retirement happens in one place at the
end (`gone`).
]]

local op = ARGV[1]
local RECLAIM = 32
local RETIRED_KEEP = 1000

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Reclaim expired leases: up to RECLAIM of them, or all of them for op `reclaim`. A member
-- becomes idle ready at once (lru), or ranked by its use count (uses).
local reclaimed, expired = 0, nil
repeat
  expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, RECLAIM)
  for _, id in ipairs(expired) do
    redis.call('ZREM', KEYS[2], id)
    -- no token: a member of a pool ordered by use resting after its return (`release`),
    -- not a lost lease: back to idle with no use counted
    local lent = redis.call('HDEL', KEYS[3], id) == 1
    if redis.call('HEXISTS', KEYS[6], id) == 1 then
      local uses = 0
      if LOST and lent then
        uses = redis.call('HINCRBY', KEYS[4], id, 1)
      elseif ORDER == 'uses' then
        uses = tonumber(redis.call('HGET', KEYS[4], id) or '0')
      end
      redis.call('ZADD', KEYS[1], ORDER == 'uses' and uses or now, id)
      if lent then
        redis.call('HINCRBY', KEYS[7], 'reclaimed', 1)
        reclaimed = reclaimed + 1
      end
    end
  end
until op ~= 'reclaim' or #expired < RECLAIM

local gone, reason, hold = {}, '', 0  -- members to retire, at the end: why, benched how long
local state = 0  -- what release answers

if op == 'checkout' then
  -- ARGV: lease_ms token fallback(0|1) avoid...
  -- -> {id, secret, uses, score, available, size, 0, expires_ms}
  --  | {'', '', 0, 0, available, size, wait_ms (-1: nothing idle), 0}
  -- (available: members ready now; size: all members, -1 unless PRODUCED)
  local avoid, n_avoid = {}, 0
  for i = 5, #ARGV do
    if not avoid[ARGV[i]] then avoid[ARGV[i]] = true; n_avoid = n_avoid + 1 end
  end
  local cands
  if ORDER == 'uses' then
    cands = redis.call('ZRANGE', KEYS[1], 0, n_avoid)
  else
    cands = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, n_avoid + 1)
  end
  local chosen, secret, fallback = nil, nil, nil
  for _, id in ipairs(cands) do
    if avoid[id] then
      fallback = fallback or id
    else
      secret = redis.call('HGET', KEYS[6], id)
      if secret then chosen = id; break end
      redis.call('ZREM', KEYS[1], id)  -- an idle id without a secret: not a member
      redis.call('HDEL', KEYS[4], id)
    end
  end
  -- Every ready member is one the task avoids. Waiting helps while a member it does not
  -- avoid exists (lent, resting); when none does, nothing would ever come and the task would
  -- wait for good, so (with `fallback`) it gets the first avoided one after all.
  if not chosen and fallback and ARGV[4] == '1' then
    local others = redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2])
    for id in pairs(avoid) do
      if redis.call('ZSCORE', KEYS[1], id) or redis.call('ZSCORE', KEYS[2], id) then
        others = others - 1
      end
    end
    if others <= 0 then
      secret = redis.call('HGET', KEYS[6], fallback)
      if secret then chosen = fallback end
    end
  end
  local wait, exp, uses, score = 0, 0, '0', '0'
  if chosen then
    redis.call('ZREM', KEYS[1], chosen)
    exp = now + tonumber(ARGV[2])
    redis.call('ZADD', KEYS[2], exp, chosen)
    redis.call('HSET', KEYS[3], chosen, ARGV[3])
    uses = redis.call('HGET', KEYS[4], chosen) or '0'
    if SCORED then score = redis.call('HGET', KEYS[5], chosen) or '0' end
    if PRODUCED then redis.call('HINCRBY', KEYS[7], 'checkouts', 1) end
  else
    chosen, secret, wait = '', '', -1
    -- no candidate at all: nothing is ready (lru), nothing is idle (uses); a member that
    -- rests (lru) says how long to wait
    if ORDER ~= 'uses' or #cands > 0 then
      local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
      if first[2] then wait = math.max(0, tonumber(first[2]) - now) end
    end
  end
  local available = 0  -- no candidate: none ready (and the count costs a command a call)
  if #cands > 0 then
    available = ORDER == 'uses' and redis.call('ZCARD', KEYS[1])
      or redis.call('ZCOUNT', KEYS[1], '-inf', now)
  end
  local size = PRODUCED and redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2]) or -1
  return {chosen, secret, uses, score, available, size, wait, exp}

elseif op == 'release' then
  -- ARGV: id token action, then by action:
  --   use     [rest_ms [max_uses [delta [max_score [uses]]]]] (each 0 when left out, uses
  --           1): requests were sent: counts `uses` uses (a process's held member returns
  --           its sum: holding.py), the score moves by delta (0: left alone, else capped at
  --           max_score), then rest_ms of cool-down, retired at max_uses (0: never) or
  --           at a score <= 0
  --   cancel  the request was never sent: back at once, nothing counted
  --   ban | retire   reason hold_ms: forget it, its id benched for hold_ms
  --   renew   lease_ms: extend the lease
  -- -> {state, size}: state 0 stale (not the current lease, or not a member), 1 back to idle,
  --    2 retired, 3 renewed; size: all members, -1 unless PRODUCED
  local id, action = ARGV[2], ARGV[4]
  local current = redis.call('HGET', KEYS[3], id) == ARGV[3]
  if action == 'ban' or action == 'retire' then
    -- even when the lease had expired and the member was lent again: the site has spoken
    if current or redis.call('HEXISTS', KEYS[6], id) == 1 then
      if action == 'ban' then redis.call('HINCRBY', KEYS[7], 'bans', 1) end
      gone[1], reason, hold, state = id, ARGV[5], tonumber(ARGV[6]), 2
    end
  elseif not current then
    -- the lease expired and was reclaimed (maybe lent again): it is not touched, but a use
    -- still counts when LOST
    if LOST and action == 'use' and redis.call('HEXISTS', KEYS[6], id) == 1 then
      local uses = redis.call('HINCRBY', KEYS[4], id, tonumber(ARGV[9] or 1))
      if ORDER == 'uses' and redis.call('ZSCORE', KEYS[1], id) then
        redis.call('ZADD', KEYS[1], uses, id)
      end
    end
  elseif action == 'renew' then
    redis.call('ZADD', KEYS[2], now + tonumber(ARGV[5]), id)
    state = 3
  else
    redis.call('ZREM', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    state = 1
    if action == 'cancel' then
      local rank = now
      if ORDER == 'uses' then rank = tonumber(redis.call('HGET', KEYS[4], id) or '0') end
      redis.call('ZADD', KEYS[1], rank, id)
      redis.call('HINCRBY', KEYS[7], 'cancelled', 1)
    else
      local uses = redis.call('HINCRBY', KEYS[4], id, tonumber(ARGV[9] or 1))
      local max_uses, delta = tonumber(ARGV[6] or 0), tonumber(ARGV[7] or 0)
      local score = nil
      if delta ~= 0 then
        score = math.min(tonumber(redis.call('HGET', KEYS[5], id) or '0') + delta,
                         tonumber(ARGV[8] or 0))
      end
      if score and score <= 0 then
        gone[1], reason, state = id, 'unhealthy', 2
      elseif max_uses > 0 and uses >= max_uses then
        gone[1], reason, state = id, 'used_up', 2
      else
        if score then redis.call('HSET', KEYS[5], id, score) end
        local rest = tonumber(ARGV[5] or 0)
        if ORDER == 'uses' and rest > 0 then
          -- the idle score is the use count, so a rest waits in :lease with no token (no
          -- checkout, renewal or return can touch it); the prologue puts it back when due
          redis.call('ZADD', KEYS[2], now + rest, id)
        else
          redis.call('ZADD', KEYS[1], ORDER == 'uses' and uses or now + rest, id)
        end
      end
    end
  end

elseif op == 'add' then
  -- ARGV: initial_score id secret [id secret ...]
  -- A member is added unless it is known, benched (`ban`), or missing from the source.
  -- -> number added
  redis.call('ZREMRANGEBYSCORE', KEYS[9], '-inf', now)
  local added = 0
  for i = 3, #ARGV, 2 do
    local id, secret = ARGV[i], ARGV[i + 1]
    if not redis.call('ZSCORE', KEYS[9], id)
        and (not KEYS[10] or redis.call('ZSCORE', KEYS[10], id))
        and redis.call('HSETNX', KEYS[6], id, secret) == 1 then
      if SCORED then redis.call('HSET', KEYS[5], id, ARGV[2]) end
      redis.call('HSET', KEYS[4], id, 0)
      redis.call('ZADD', KEYS[1], ORDER == 'uses' and 0 or now, id)
      redis.call('HINCRBY', KEYS[7], 'produced', 1)
      added = added + 1
    end
  end
  return added

elseif op == 'retire' then
  -- ARGV: reason hold_ms only_idle(0|1) id... -> number retired (only_idle: lent ones stay)
  reason, hold = ARGV[2], tonumber(ARGV[3])
  for i = 5, #ARGV do
    local id = ARGV[i]
    if redis.call('HEXISTS', KEYS[6], id) == 1
        and (ARGV[4] ~= '1' or redis.call('ZSCORE', KEYS[1], id)) then
      gone[#gone + 1] = id
    end
  end

elseif op == 'sizes' then
  -- -> {available, size, leased}
  local leased = redis.call('ZCARD', KEYS[2])
  local available = ORDER == 'uses' and redis.call('ZCARD', KEYS[1])
    or redis.call('ZCOUNT', KEYS[1], '-inf', now)
  return {available, redis.call('ZCARD', KEYS[1]) + leased, leased}

elseif op == 'reclaim' then
  -- every expired lease (see the prologue) -> number reclaimed
  return reclaimed

else
  return redis.error_reply('lease.lua: unknown op ' .. tostring(op))
end

-- Retire what the operation decided to: forget each member; `hold` ms > 0 also keeps its id
-- from being added again until then.
for _, id in ipairs(gone) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  redis.call('HDEL', KEYS[4], id)
  if SCORED then redis.call('HDEL', KEYS[5], id) end
  redis.call('HDEL', KEYS[6], id)
  redis.call('HINCRBY', KEYS[7], 'retired', 1)
  redis.call('HINCRBY', KEYS[7], 'retired:' .. reason, 1)
  redis.call('ZADD', KEYS[8], math.floor(now / 1000), id)
  if hold > 0 then redis.call('ZADD', KEYS[9], now + hold, id) end
end
if #gone > 0 then redis.call('ZREMRANGEBYRANK', KEYS[8], 0, -(RETIRED_KEEP + 1)) end

if op == 'retire' then return #gone end
local size = PRODUCED and redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2]) or -1
return {state, size}

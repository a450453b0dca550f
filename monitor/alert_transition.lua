-- One alert state change (ok -> pending -> firing -> resolved), and the notification it
-- queues: the only place one is queued, so two monitors evaluating at once queue one.
-- KEYS: 1 state hash, 2 notify list, 3 history list
-- ARGV: 1 field, 2 breached (1/0), 3 now, 4 hold seconds, 5 value ('' = none),
--       6 new incident id, 7 payload JSON, 8 history max
local f, breached, now, hold = ARGV[1], ARGV[2] == '1', tonumber(ARGV[3]), tonumber(ARGV[4])
local value = tonumber(ARGV[5])
local cur = redis.call('HGET', KEYS[1], f)
local st = {state = 'ok'}
if cur then st = cjson.decode(cur) end
local function notify(status)
  local n = cjson.decode(ARGV[7])
  n.status = status
  n.incident = st.incident
  n.started_at = st.since
  n.fired_at = st.fired_at
  n.value = value
  if status == 'resolved' then
    n.summary = n.summary_resolved
    n.resolved_at = now
    n.duration = now - st.fired_at
  else
    n.summary = n.summary_firing
  end
  n.summary_firing = nil
  n.summary_resolved = nil
  local msg = cjson.encode(n)
  redis.call('RPUSH', KEYS[2], msg)
  redis.call('LPUSH', KEYS[3], msg)
  redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[8]) - 1)
end
if breached then
  if st.state == 'firing' then
    st.value = value
    st.last = now
    redis.call('HSET', KEYS[1], f, cjson.encode(st))
    return 'firing'
  end
  if st.state ~= 'pending' then st = {state = 'pending', since = now} end
  st.value = value
  st.last = now
  if now - st.since >= hold then
    st.state = 'firing'
    st.fired_at = now
    st.incident = ARGV[6]
    redis.call('HSET', KEYS[1], f, cjson.encode(st))
    notify('firing')
    return 'fire'
  end
  redis.call('HSET', KEYS[1], f, cjson.encode(st))
  return 'pending'
end
if st.state == 'firing' then
  notify('resolved')
  redis.call('HDEL', KEYS[1], f)
  return 'resolve'
end
if cur then redis.call('HDEL', KEYS[1], f) end
return 'ok'

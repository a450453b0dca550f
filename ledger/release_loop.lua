local moved = 0
while cap == 0 or inflight + moved < cap do
  local m = redis.call('LPOP', KEYS[3])
  if not m then break end
  redis.call('RPUSH', KEYS[4], m)
  moved = moved + 1
end
if moved > 0 then
  redis.call('HINCRBY', KEYS[1], 'inflight', moved)
  redis.call('EXPIRE', KEYS[4], 86400)
end

-- Release a schedule entry's trigger lock only if this trigger still holds it.
-- KEYS: 1 the lock; ARGV: 1 the holder's token. Returns 1 released, 0 not ours (expired).
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0

--[[ Replace one sealed value only if it is still the one that was read (external_interface/
reseal.py): a worker that retired the member or took the ticket in between wins.

KEYS  1 the key (a hash of secrets, or a vault ticket's string)
ARGV  1 the hash field ('' for a string key)  2 the value read  3 the value to write
-> 1 replaced, 0 changed or gone meanwhile (left alone)
]]
if ARGV[1] == '' then
  if redis.call('GET', KEYS[1]) ~= ARGV[2] then return 0 end
  redis.call('SET', KEYS[1], ARGV[3], 'KEEPTTL')
  return 1
end
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1

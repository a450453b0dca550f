-- Adds counts to metric hashes, each hash's fields with one HMGET and one HSET (a HINCRBY a
-- field cost a command each: ~25 fields a task's and its site's hash an interval). The script
-- is atomic, so the fields end where HINCRBYs would have left them.
-- KEYS: the hashes; ARGV: per key, its number of fields n, then n field/count pairs.
-- Sums are written as integers (`%d`): exact to 2^53, as a Lua number is a double.
local rcall, unpack, tonumber, fmt = redis.call, unpack, tonumber, string.format
local i = 1
for k = 1, #KEYS do
  local n = tonumber(ARGV[i]); i = i + 1
  for a = 0, n - 1, 1000 do  -- unpack() has a limit (the Lua C stack)
    local b = math.min(a + 999, n - 1)
    local fields = {}
    for f = a, b do fields[#fields + 1] = ARGV[i + 2 * f] end
    local cur = rcall('HMGET', KEYS[k], unpack(fields))
    local set = {}
    for f = a, b do
      set[#set + 1] = ARGV[i + 2 * f]
      set[#set + 1] = fmt('%d', (tonumber(cur[f - a + 1]) or 0) + tonumber(ARGV[i + 2 * f + 1]))
    end
    rcall('HSET', KEYS[k], unpack(set))
  end
  i = i + 2 * n
end
return #KEYS

-- XAUTOCLAIM ... JUSTID through a script: redis-py's reply parser would drop the cursor.
return redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4],
                  'COUNT', ARGV[5], 'JUSTID')

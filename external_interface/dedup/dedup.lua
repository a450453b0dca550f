--[[ Dedup buckets: check and mark hashed ids in one binary string per bucket.

The layout and the arithmetic behind it are in external_interface/dedup/layout.py and docs/dedup.md.
A bucket string is (all integers big-endian)

  [NB x uint32 coarse][S x uint16 ends][n x 9-byte main][uint16 count][P x 14-byte pending]

  coarse[j]  main records in the sub-buckets before 16*j (block j starts there)
  ends[s]    main records from block start through sub-bucket s, so sub-bucket s is
             [coarse + ends[s-1], coarse + ends[s]) with ends[s-1] = 0 at a block start
  main       fp:uint40 | first-seen hour:uint16 | content fp:uint16 (0 = none recorded),
             sorted by (sub-bucket, fp): sub-bucket s is a contiguous, sorted run
  pending    sub:uint16 | fp:uint40 | hour:uint16 | content fp:uint16 | at:uint24, the first
             `count` slots sorted by (sub-bucket, fp), the rest zero. `at` is where the record
             goes in main (main only changes at a merge, so it stays right until then); bytes
             3..11 are its main record. An id lives in main or in pending, never both.

Why a pending area: Lua cannot edit a string in place, so inserting into the sorted main run
means rebuilding the whole bucket, and the AOF then logs the whole bucket. New records go to
the fixed-size pending area instead (one SETRANGE of the count and at most P*14 bytes; the
string never changes length, so Redis never reallocates it) and are merged into main, with one
SET, only when it is full: one rebuild per P inserts.

KEYS[k]    bucket key
ARGV[1]    mode: 0 check (read-only), 1 mark, 2 mark and restart the seen clock (refresh)
ARGV[2]    now, in hours since the namespace epoch (0..65535)
ARGV[3]    S, sub-buckets per bucket
ARGV[4]    P, pending slots per bucket
ARGV[4+k]  the n ops on KEYS[k]: n x uint64 (sub-bucket << 40 | fp), sorted (equal ones keep
           the caller's order), then their n x uint16 content fps (0 = no value given)
Returns one string per key, 3 bytes per op ">BH": status (0 new, 1 unchanged, 2 changed) and
the stored first-seen hour before this op (0 for new).
]]

local mode = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
local S = tonumber(ARGV[3])
local P = tonumber(ARGV[4])
local BLK = 16 -- sub-buckets per directory block
local NB = math.floor((S + BLK - 1) / BLK)
local CNT = 4 * NB -- byte offset (0-based) of ends[0]
local DIR = CNT + 2 * S -- byte offset (0-based) of main record 0
local REC, PREC = 9, 14
local PLEN = P * PREC

local sunpack, spack, ssub, srep = struct.unpack, struct.pack, string.sub, string.rep
local concat = table.concat

local cfmt = '>' .. srep('I4', NB) -- the block starts
local efmt = '>' .. srep('H', S) -- the in-block ends (S <= 4096: within Lua's C stack)
local ZEROS = srep('\0', 2 + PLEN) -- an empty pending area with its count

-- Append to parts the n fixed-size records at s[off+1 ..] with edits applied. An edit is
-- {index, record, replace}: insert before old record `index`, or replace it. Edits are in
-- index order, an insert before a replace at the same index.
local function splice(parts, np, s, off, len, n, edits)
  local cursor = 0
  for _, e in ipairs(edits) do
    local idx = e[1]
    if idx > cursor then
      np = np + 1
      parts[np] = ssub(s, off + cursor * len + 1, off + idx * len)
    end
    np = np + 1
    parts[np] = e[2]
    if e[3] then
      cursor = idx + 1
    else
      cursor = idx
    end
  end
  if n > cursor then
    np = np + 1
    parts[np] = ssub(s, off + cursor * len + 1, off + n * len)
  end
  return np
end

-- Merge two edit lists, each in index order, into one (inserts first on a tie).
local function merge_edits(x, y)
  local out, i, j = {}, 1, 1
  while i <= #x or j <= #y do
    local e, f = x[i], y[j]
    if f == nil or (e ~= nil and (e[1] < f[1] or (e[1] == f[1] and not e[3]))) then
      out[#out + 1] = e
      i = i + 1
    else
      out[#out + 1] = f
      j = j + 1
    end
  end
  return out
end

-- the bucket being worked on (set per key by run)
local b, PO, npend

-- [lo, hi): the main records of sub-bucket s
local function sub_range(s)
  local blk = (s - s % BLK) / BLK
  local base = sunpack('>I4', b, blk * 4 + 1)
  if s == blk * BLK then
    return base, base + sunpack('>H', b, CNT + 2 * s + 1)
  end
  local e0, e1 = sunpack('>HH', b, CNT + 2 * s - 1)
  return base + e0, base + e1
end

-- lower bound of fp among main records [lo, hi)
local function main_bound(lo, hi, fp)
  while lo < hi do
    local mid = lo + hi
    mid = (mid - mid % 2) / 2 -- floor without a C call
    if sunpack('>I5', b, DIR + mid * REC + 1) < fp then
      lo = mid + 1
    else
      hi = mid
    end
  end
  return lo
end

-- lower bound of (s, fp) among the pending records
local function pend_bound(s, fp)
  local lo, hi = 0, npend
  while lo < hi do
    local mid = lo + hi
    mid = (mid - mid % 2) / 2 -- floor without a C call
    local s2, f2 = sunpack('>HI5', b, PO + mid * PREC + 1)
    if s2 < s or (s2 == s and f2 < fp) then
      lo = mid + 1
    else
      hi = mid
    end
  end
  return lo
end

-- The directory after adding incs[s] main records to sub-bucket s, as two strings.
local function new_directory(key, incs)
  local coarse = { sunpack(cfmt, b, 1) }
  local ends = { sunpack(efmt, b, CNT + 1) }
  local acc, run = 0, 0 -- records added before this block, and in it so far
  for s = 0, S - 1 do
    if s % BLK == 0 then
      acc, run = acc + run, 0
      local j = s / BLK + 1
      coarse[j] = coarse[j] + acc
    end
    local inc = incs[s]
    if inc then
      run = run + inc
    end
    if run > 0 then
      local e = ends[s + 1] + run
      if e > 65535 then
        error('dedup: block overflow in ' .. key .. ': the store is far past its capacity')
      end
      ends[s + 1] = e
    end
  end
  return spack(cfmt, unpack(coarse, 1, NB)), spack(efmt, unpack(ends, 1, S))
end

local function run(key, ops)
  local nops = #ops / 10
  local CF = 8 * nops + 1 -- 1-based position of the first content fp
  b = redis.call('GET', key)
  local fresh = not b
  if fresh then
    if mode == 0 then
      return srep('\0\0\0', nops)
    end
    b = srep('\0', DIR) .. ZEROS
  end
  PO = #b - PLEN -- byte offset (0-based) of pending slot 0; the count is just before
  npend = sunpack('>H', b, PO - 1)
  local nmain = (PO - 2 - DIR) / REC

  local res, nres = {}, 0
  local mm, pm, ins = {}, {}, {} -- main edits, pending edits, new records {s, fp, hour, cfp, pj}
  local i = 0
  while i < nops do
    local s, fp = sunpack('>HI5', ops, i * 8 + 2)
    local cfp = sunpack('>H', ops, CF + 2 * i)
    local lo, hi = sub_range(s)
    local a = main_bound(lo, hi, fp)
    local where, pj, at, hour, scfp = nil, nil, a, 0, 0
    if a < hi then
      local f2, h2, c2 = sunpack('>I5HH', b, DIR + a * REC + 1)
      if f2 == fp then
        where, hour, scfp = 'main', h2, c2
      end
    end
    if where == nil then
      pj = pend_bound(s, fp)
      if pj < npend then
        local s2, f2, h2, c2, a2 = sunpack('>HI5HHI3', b, PO + pj * PREC + 1)
        if s2 == s and f2 == fp then
          where, at, hour, scfp = 'pend', a2, h2, c2
        end
      end
    end

    -- every op on this (sub-bucket, fp), in order: each sees the ones before it
    local exists, dirty = where ~= nil, false
    while true do
      local st = 0
      if exists then
        if cfp == 0 or cfp == scfp then
          st = 1
        else
          st = 2
        end
      end
      nres = nres + 1
      res[nres] = spack('>BH', st, hour)
      if mode > 0 then
        if not exists then
          exists, hour, scfp, dirty = true, now, cfp, true
        else
          if st == 2 then
            scfp, dirty = cfp, true
          end
          if mode == 2 and hour ~= now then
            hour, dirty = now, true
          end
        end
      end
      i = i + 1
      if i >= nops then
        break
      end
      local s2, fp2 = sunpack('>HI5', ops, i * 8 + 2)
      if s2 ~= s or fp2 ~= fp then
        break
      end
      cfp = sunpack('>H', ops, CF + 2 * i)
    end

    if dirty then
      if where == 'main' then
        mm[#mm + 1] = { a, spack('>I5HH', fp, hour, scfp), true }
      elseif where == 'pend' then
        pm[#pm + 1] = { pj, spack('>HI5HHI3', s, fp, hour, scfp, at), true }
      else
        ins[#ins + 1] = { s, fp, hour, scfp, pj, at }
      end
    end
  end

  if #ins == 0 then
    for _, e in ipairs(mm) do
      redis.call('SETRANGE', key, DIR + e[1] * REC, e[2])
    end
    for _, e in ipairs(pm) do
      redis.call('SETRANGE', key, PO + e[1] * PREC, e[2])
    end
  elseif npend + #ins <= P then
    -- room in pending: rewrite the count and the used slots in place, one SETRANGE
    local used
    if #ins == 1 and #pm == 0 then -- the common case, without the tables
      local r = ins[1]
      local cut = PO + r[5] * PREC
      used = ssub(b, PO + 1, cut)
        .. spack('>HI5HHI3', r[1], r[2], r[3], r[4], r[6])
        .. ssub(b, cut + 1, PO + npend * PREC)
    else
      local adds = {}
      for j, r in ipairs(ins) do
        adds[j] = { r[5], spack('>HI5HHI3', r[1], r[2], r[3], r[4], r[6]), false }
      end
      local parts = {}
      splice(parts, 0, b, PO, PREC, npend, merge_edits(adds, pm))
      used = concat(parts)
    end
    used = spack('>H', npend + #ins) .. used
    if fresh then
      redis.call('SET', key, ssub(b, 1, PO - 2) .. used .. ssub(ZEROS, #used + 1))
    else
      redis.call('SETRANGE', key, PO - 2, used)
    end
    for _, e in ipairs(mm) do
      redis.call('SETRANGE', key, DIR + e[1] * REC, e[2])
    end
  else
    -- pending full: merge it and the new records into main, rebuild the bucket
    local xa, xr, nx = {}, {}, 0 -- main insertion index and 9-byte record of each, in order
    local incs = {}
    local function add(s, at, rec)
      nx = nx + 1
      xa[nx], xr[nx] = at, rec
      incs[s] = (incs[s] or 0) + 1
    end
    local k, q = 1, 1
    for j = 0, npend - 1 do
      local src, off = b, PO + j * PREC
      if pm[q] and pm[q][1] == j then
        src, off = pm[q][2], 0
        q = q + 1
      end
      local s, fp, _, _, at = sunpack('>HI5HHI3', src, off + 1)
      while ins[k] and (ins[k][1] < s or (ins[k][1] == s and ins[k][2] < fp)) do
        local r = ins[k]
        add(r[1], r[6], spack('>I5HH', r[2], r[3], r[4]))
        k = k + 1
      end
      add(s, at, ssub(src, off + 3, off + 11)) -- bytes 3..11: the main record
    end
    while ins[k] do
      local r = ins[k]
      add(r[1], r[6], spack('>I5HH', r[2], r[3], r[4]))
      k = k + 1
    end
    local cstr, estr = new_directory(key, incs)
    local parts, np = { cstr, estr }, 2
    -- main records with the inserts (xa) and replacements (mm) in index order, inserts first
    local cursor, j, m = 0, 1, 1
    while j <= nx or mm[m] do
      local e = mm[m]
      if j <= nx and (e == nil or xa[j] <= e[1]) then
        local idx = xa[j]
        if idx > cursor then
          np = np + 1
          parts[np] = ssub(b, DIR + cursor * REC + 1, DIR + idx * REC)
          cursor = idx
        end
        np = np + 1
        parts[np] = xr[j]
        j = j + 1
      else
        local idx = e[1]
        if idx > cursor then
          np = np + 1
          parts[np] = ssub(b, DIR + cursor * REC + 1, DIR + idx * REC)
        end
        np = np + 1
        parts[np] = e[2]
        cursor = idx + 1
        m = m + 1
      end
    end
    if nmain > cursor then
      np = np + 1
      parts[np] = ssub(b, DIR + cursor * REC + 1, DIR + nmain * REC)
    end
    parts[np + 1] = ZEROS
    redis.call('SET', key, concat(parts))
  end
  return concat(res)
end

local out = {}
for k = 1, #KEYS do
  out[k] = run(KEYS[k], ARGV[4 + k])
end
return out

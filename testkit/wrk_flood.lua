-- wrk script: every request carries a new made-up bearer token; counts the answers by status
-- and prints "progress <thread> <answers> <answers 429>" every 200 answers, "status <code>
-- <count>" lines at the end. Used by testkit/kubeauth.py (WrkFlood).
local threads = {}
local counter = 1

function setup(thread)
  thread:set("id", counter)
  table.insert(threads, thread)
  counter = counter + 1
end

function init(args)
  math.randomseed(id * 7919 + os.time())
  statuses = {}
  answers = 0
  throttled = 0
  sent = 0
end

function request()
  sent = sent + 1
  local token = string.format("made-up-%d-%d-%08x%08x", id, sent,
                              math.random(0, 0x7fffffff), math.random(0, 0x7fffffff))
  return wrk.format("GET", "/metrics", {["Authorization"] = "Bearer " .. token})
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
  answers = answers + 1
  if status == 429 then throttled = throttled + 1 end
  if answers % 200 == 0 then
    io.stdout:write(string.format("progress %d %d %d\n", id, answers, throttled))
    io.stdout:flush()
  end
end

function done(summary, latency, requests)
  local total = {}
  for _, thread in ipairs(threads) do
    for code, n in pairs(thread:get("statuses")) do
      total[code] = (total[code] or 0) + n
    end
  end
  for code, n in pairs(total) do
    io.stdout:write(string.format("status %d %d\n", code, n))
  end
end

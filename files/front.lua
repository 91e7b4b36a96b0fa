-- front.lua: the front's hold, loaded by HAProxy (front.cfg's lua-load).
-- Shipped as is by llama-rpc-deploy (files/).
--
-- llama_hold BACKEND SERVER SECONDS (an http-request action): while SERVER of BACKEND is not UP by its
-- health check (llama-server down, restarting, loading its model, or drained before a planned restart),
-- the request waits here, polling every 100 ms, until SECONDS after the front first received it
-- (its X-Llama-Front-Since header, set by the public frontend: a replayed request keeps its first arrival).
-- Then it goes on: to llama-server if it is UP, else to a 503 with Retry-After.
--
-- After a reload (systemctl reload llama-front), the old HAProxy process finishes what it holds but no longer
-- checks llama-server's health, so its view of llama-server is frozen. There a held request stops waiting: if
-- llama-server is not up it gets a 503 that the replay sends again, to the hold of the new process (the
-- internal socket is the new process's by then), where the health checks run.
--
-- `show front` on the admin socket prints what was held:
--   held      requests that waited here (one replayed after a crash and held again counts twice)
--   holding   requests waiting here now
--   expired   requests still waiting when their time was up (answered 503)
-- and, for the workers' sleep (files/llama-sleep.py, which sets the last two with `set front ...`):
--   activity  when the last request that counts for the idle clock arrived (ms since the epoch; llama_activity)
--   answered  when llama-server last sent an answer's headers (ms; llama_answered)
--   asleep    1 while the workers sleep (`set front asleep 0|1`): the fetch lua.llama_asleep
--   wake-failed  the workers did not wake: until when (ms) held and new requests get 503 at once, and why
--               (`set front wake-failed SECONDS MESSAGE`, `clear front wake-failed`)

local held, holding, expired = 0, 0, 0
local activity, answered, asleep = 0, 0, 0
local failed_until, failed_message, failed_retry = 0, "", 30

local function now_ms()
  local t = core.now()
  return t.sec * 1000 + t.usec // 1000
end

local function up(server)
  return server:get_stats()["status"] == "UP"
end

local function stopping()  -- this process was reloaded: a newer one serves, and this one only finishes its work
  return tonumber(core.get_info()["Stopping"]) == 1
end

local function wake_failed_reply(txn)  -- the workers did not wake: say so at once
  local body = string.format('{"error":{"code":503,"message":%q,"type":"unavailable_error"}}', failed_message)
  return txn:reply({
    status = 503,
    headers = { ["content-type"] = { "application/json" }, ["retry-after"] = { tostring(failed_retry) } },
    body = body,
  })
end

core.register_action("llama_hold", { "http-req" }, function(txn, backend, server_name, seconds)
  local server = core.backends[backend].servers[server_name]
  if up(server) then
    return
  end
  local since = tonumber(txn.sf:req_hdr("x-llama-front-since")) or now_ms()
  local deadline = since + tonumber(seconds) * 1000
  if now_ms() >= deadline then
    return
  end
  held, holding = held + 1, holding + 1
  while not up(server) and not stopping() and now_ms() < deadline and now_ms() >= failed_until do
    core.msleep(100)
  end
  holding = holding - 1
  if now_ms() < failed_until and not up(server) then
    txn:done(wake_failed_reply(txn))
    return
  end
  if not up(server) and not stopping() then
    expired = expired + 1
  end
end, 3)


-- llama_activity (an http-request action): this request counts for the idle clock
core.register_action("llama_activity", { "http-req" }, function(txn)
  activity = tonumber(txn.f:date(0, "ms"))  -- the wall clock, as llama-sleep.py's (core.now() is HAProxy's own)
end, 0)

-- llama_answered (an http-response action on llama-server's backend): llama-server answered
core.register_action("llama_answered", { "http-res" }, function(txn)
  answered = tonumber(txn.f:date(0, "ms"))
end, 0)

core.register_fetches("llama_asleep", function(txn)
  return asleep == 1
end)

core.register_cli({ "set", "front", "asleep" }, "set front asleep 0|1 : the workers sleep (llama-sleep.py)", function(applet, a, b, c, value)
  asleep = tonumber(value) == 1 and 1 or 0
end)

core.register_cli({ "set", "front", "wake-failed" }, "set front wake-failed SECONDS MESSAGE : 503 at once for SECONDS", function(applet, a, b, c, seconds, ...)
  failed_retry = tonumber(seconds) or 30
  failed_until = now_ms() + failed_retry * 1000
  failed_message = table.concat({ ... }, " ")
end)

core.register_cli({ "clear", "front", "wake-failed" }, "clear front wake-failed : hold requests again", function(applet)
  failed_until, failed_message = 0, ""
end)

core.register_cli({ "show", "front" }, "show front : requests held by the front (llama-rpc-deploy)", function(applet)
  applet:send(string.format("held %d\nholding %d\nexpired %d\nactivity %d\nanswered %d\nasleep %d\n",
    held, holding, expired, activity, answered, asleep))
  if now_ms() < failed_until then
    applet:send("wake-failed " .. failed_message .. "\n")
  end
end)

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

local held, holding, expired = 0, 0, 0

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
  while not up(server) and not stopping() and now_ms() < deadline do
    core.msleep(100)
  end
  holding = holding - 1
  if not up(server) and not stopping() then
    expired = expired + 1
  end
end, 3)

core.register_cli({ "show", "front" }, "show front : requests held by the front (llama-rpc-deploy)", function(applet)
  applet:send(string.format("held %d\nholding %d\nexpired %d\n", held, holding, expired))
end)

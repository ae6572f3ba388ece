-- Argo CD health check of an ExactlyOnceStream (streaming.eos.dev): resource.customizations.health.
-- Lua 5.1 as Argo CD's gopher-lua runs a customization: the base and table libraries only (no string).
-- Degraded: the operator says Degraded or Stalled (a failed driver, restarts exhausted, an invalid or rejected
-- spec, a replay horizon shrinking); Suspended: job.state suspended and stopped; Progressing: the operator has
-- not acted on the current generation yet, or is working (Progressing True); Healthy: Ready True.
local hs = {status = "Progressing", message = "waiting for the operator's first status"}

local function condition(status, kind)
  for _, c in ipairs(status.conditions or {}) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function said(c)
  if c.message ~= nil and c.message ~= "" then
    return c.reason .. ": " .. c.message
  end
  return c.reason
end

local function judge(meta, status)
  if meta.deletionTimestamp ~= nil then
    return "Progressing", "pending deletion: the driver stops at a clean batch boundary"
  end
  if status == nil or status.conditions == nil then
    return nil
  end
  if meta.generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration ~= meta.generation then
    return "Progressing", "generation " .. meta.generation .. " not yet acted on (status is for generation "
      .. status.observedGeneration .. ")"
  end
  local ready, progressing = condition(status, "Ready"), condition(status, "Progressing")
  for _, kind in ipairs({"Stalled", "Degraded"}) do
    local c = condition(status, kind)
    if c ~= nil and c.status == "True" then
      return "Degraded", said(c)
    end
  end
  if ready ~= nil and ready.reason == "Suspended" then
    return "Suspended", said(ready)
  end
  if progressing ~= nil and progressing.status == "True" then
    return "Progressing", said(progressing)
  end
  if ready ~= nil and ready.status == "True" then
    return "Healthy", said(ready)
  end
  if ready ~= nil then
    return "Progressing", said(ready)
  end
  return nil
end

local verdict, message = judge(obj.metadata or {}, obj.status)
if verdict ~= nil then
  hs.status, hs.message = verdict, message
end
return hs

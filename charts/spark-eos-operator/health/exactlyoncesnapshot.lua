-- Argo CD health check of an ExactlyOnceSnapshot (streaming.eos.dev): resource.customizations.health.
-- Lua 5.1 as Argo CD's gopher-lua runs a customization: the base and table libraries only (no string).
-- A snapshot is a one-shot job: Healthy once Completed (Ready True), Degraded once Failed (Stalled True, or
-- Ready False with reason Failed), Progressing before (pending, copying, waiting to retry, a Pod that cannot
-- start yet) and while it is deleted.
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
    return "Progressing", "pending deletion: the snapshot's files are disposed of first"
  end
  if status == nil or status.conditions == nil then
    return nil
  end
  if meta.generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration ~= meta.generation then
    return "Progressing", "generation " .. meta.generation .. " not yet acted on (status is for generation "
      .. status.observedGeneration .. ")"
  end
  local ready, stalled = condition(status, "Ready"), condition(status, "Stalled")
  if stalled ~= nil and stalled.status == "True" then
    return "Degraded", said(stalled)
  end
  if ready == nil then
    return nil
  end
  if ready.status == "True" then
    return "Healthy", said(ready)
  end
  if ready.reason == "Failed" then
    return "Degraded", said(ready)
  end
  return "Progressing", said(ready)
end

local verdict, message = judge(obj.metadata or {}, obj.status)
if verdict ~= nil then
  hs.status, hs.message = verdict, message
end
return hs

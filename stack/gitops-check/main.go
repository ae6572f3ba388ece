// Command gitops-check tells what two GitOps tools make of Kubernetes objects: kstatus
// (sigs.k8s.io/cli-utils/pkg/kstatus/status, the library Flux and kpt compute status with) and an Argo CD
// health check in Lua, run in gopher-lua the way Argo CD runs a resource customization.
//
//	gitops-check [--health GROUP/KIND=FILE.lua ...] < objects.json > results.json
//
// objects.json is a JSON array of objects; the result is a JSON array, one entry per object, in order:
// {"kstatus": {"status", "message"}, "argocd": {"status", "message"}} ("argocd" only for a kind given a
// health script; "error" instead of a result that could not be computed).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

// Health is a verdict of one tool.
type Health struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

// Result is what both tools say of one object.
type Result struct {
	Kstatus *Health `json:"kstatus,omitempty"`
	ArgoCD  *Health `json:"argocd,omitempty"`
	Error   string  `json:"error,omitempty"`
}

// The health statuses Argo CD accepts from a script; any other becomes Unknown.
var argoStatuses = map[string]bool{"Unknown": true, "Progressing": true, "Suspended": true, "Healthy": true,
	"Degraded": true, "Missing": true}

type scripts map[string]string

func (s scripts) String() string { return fmt.Sprint(map[string]string(s)) }

func (s scripts) Set(v string) error {
	key, file, ok := strings.Cut(v, "=")
	if !ok {
		return fmt.Errorf("want GROUP/KIND=FILE, got %q", v)
	}
	text, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	s[key] = string(text)
	return nil
}

func main() {
	health := scripts{}
	flag.Var(health, "health", "GROUP/KIND=FILE: the Argo CD health script of that kind (repeatable)")
	flag.Parse()
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail(err)
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		fail(fmt.Errorf("stdin is not a JSON array of objects: %w", err))
	}
	results := make([]Result, 0, len(raw))
	for _, doc := range raw {
		results = append(results, check(doc, health))
	}
	out := json.NewEncoder(os.Stdout)
	out.SetIndent("", "  ")
	if err := out.Encode(results); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "gitops-check:", err)
	os.Exit(2)
}

func check(doc json.RawMessage, health scripts) Result {
	// Decoded as a client reads an object: integers are int64, as kstatus's generation check requires.
	var u unstructured.Unstructured
	if err := u.UnmarshalJSON(doc); err != nil {
		return Result{Error: err.Error()}
	}
	var res Result
	computed, err := status.Compute(&u)
	if err != nil {
		return Result{Error: "kstatus: " + err.Error()}
	}
	res.Kstatus = &Health{Status: computed.Status.String(), Message: computed.Message}
	gvk := u.GroupVersionKind()
	if script, ok := health[gvk.Group+"/"+gvk.Kind]; ok {
		verdict, err := argoHealth(u.Object, script)
		if err != nil {
			return Result{Kstatus: res.Kstatus, Error: "lua: " + err.Error()}
		}
		res.ArgoCD = verdict
	}
	return res
}

// argoHealth runs a health script as Argo CD runs a resource customization without useOpenLibs (util/lua in
// argo-cd): a state with only the package, base and table libraries (Argo CD adds a reduced os library, which
// the chart's scripts do not use, so a script that did would fail here), a one-second deadline, the object as
// the global obj (objects as tables, arrays as 1-based tables, numbers as Lua numbers), and the table it
// returns read for status and message; a status Argo CD does not know becomes Unknown, as there.
func argoHealth(obj map[string]interface{}, script string) (*Health, error) {
	L := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer L.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{{lua.LoadLibName, lua.OpenPackage}, {lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable}} {
		if err := L.CallByParam(lua.P{Fn: L.NewFunction(lib.open), NRet: 0, Protect: true},
			lua.LString(lib.name)); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	L.SetContext(ctx)
	L.SetGlobal("obj", toLua(L, obj))
	if err := L.DoString(script); err != nil {
		return nil, err
	}
	table, ok := L.Get(-1).(*lua.LTable)
	if !ok {
		return nil, fmt.Errorf("the script returned %s, not a table", L.Get(-1).Type())
	}
	verdict := &Health{Status: lua.LVAsString(table.RawGetString("status")),
		Message: lua.LVAsString(table.RawGetString("message"))}
	if !argoStatuses[verdict.Status] {
		return &Health{Status: "Unknown", Message: "Lua returned an invalid health status"}, nil
	}
	return verdict, nil
}

func toLua(L *lua.LState, value interface{}) lua.LValue {
	switch v := value.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(v)
	case string:
		return lua.LString(v)
	case int64:
		return lua.LNumber(v)
	case float64:
		return lua.LNumber(v)
	case []interface{}:
		t := L.CreateTable(len(v), 0)
		for _, item := range v {
			t.Append(toLua(L, item))
		}
		return t
	case map[string]interface{}:
		t := L.CreateTable(0, len(v))
		for key, item := range v {
			t.RawSetH(lua.LString(key), toLua(L, item))
		}
		return t
	}
	return lua.LNil
}

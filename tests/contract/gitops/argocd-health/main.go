// argocd-health runs an Argo CD resource health script the way Argo CD's Lua VM does
// (util/lua in argo-cd): gopher-lua with only the package, base, table and a reduced os library
// opened, the live object as the global `obj` (JSON numbers become Lua numbers, objects and
// arrays become tables), the script run as a chunk whose returned table is encoded with
// gopher-json into {status, message}; a status Argo CD does not know becomes Unknown.
//
// Usage: argocd-health SCRIPT < objects.json   (a JSON array of objects)
// Output: a JSON array of {"status": ..., "message": ...} or {"error": ...}, one per object.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	lua "github.com/yuin/gopher-lua"
	luajson "layeh.com/gopher-json"
)

type health struct {
	Status  string `json:"status,omitempty"`
	Message string `json:"message,omitempty"`
	Error   string `json:"error,omitempty"`
}

var known = map[string]bool{
	"Healthy": true, "Progressing": true, "Degraded": true, "Suspended": true,
	"Missing": true, "Unknown": true,
}

func decode(l *lua.LState, v any) lua.LValue {
	switch x := v.(type) {
	case json.Number:
		f, err := x.Float64()
		if err != nil {
			return lua.LNil
		}
		return lua.LNumber(f)
	case string:
		return lua.LString(x)
	case bool:
		return lua.LBool(x)
	case []any:
		t := l.CreateTable(len(x), 0)
		for _, item := range x {
			t.Append(decode(l, item))
		}
		return t
	case map[string]any:
		t := l.CreateTable(0, len(x))
		for k, item := range x {
			t.RawSetH(lua.LString(k), decode(l, item))
		}
		return t
	}
	return lua.LNil
}

// safeOs stands for the reduced os library Argo CD leaves scripts (time and clock here).
func safeOs(l *lua.LState) int {
	mod := l.NewTable()
	l.SetFuncs(mod, map[string]lua.LGFunction{
		"time":  func(s *lua.LState) int { s.Push(lua.LNumber(time.Now().Unix())); return 1 },
		"clock": func(s *lua.LState) int { s.Push(lua.LNumber(float64(time.Now().UnixNano()) / 1e9)); return 1 },
	})
	l.Push(mod)
	return 1
}

func run(script string, obj any) health {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, lib := range []struct {
		name string
		fn   lua.LGFunction
	}{{lua.LoadLibName, lua.OpenPackage}, {lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable}, {lua.OsLibName, safeOs}} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(lib.fn), NRet: 0, Protect: true},
			lua.LString(lib.name)); err != nil {
			return health{Error: err.Error()}
		}
	}
	l.PreloadModule(lua.OsLibName, safeOs)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("obj", decode(l, obj))
	if err := l.DoString(script); err != nil {
		return health{Error: err.Error()}
	}
	ret := l.Get(-1)
	if ret.Type() != lua.LTTable {
		return health{Error: fmt.Sprintf("expect table output from Lua script, not %s", ret.Type())}
	}
	encoded, err := luajson.Encode(ret)
	if err != nil {
		return health{Error: err.Error()}
	}
	var h health
	if err := json.Unmarshal(encoded, &h); err != nil {
		return health{Error: err.Error()}
	}
	if !known[h.Status] {
		return health{Status: "Unknown", Message: "Lua returned an invalid health status"}
	}
	return h
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: argocd-health SCRIPT < objects.json")
		os.Exit(2)
	}
	script, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dec := json.NewDecoder(os.Stdin)
	dec.UseNumber()
	var objects []any
	if err := dec.Decode(&objects); err != nil {
		fmt.Fprintln(os.Stderr, "objects:", err)
		os.Exit(1)
	}
	out := make([]health, 0, len(objects))
	for _, obj := range objects {
		out = append(out, run(string(script), obj))
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Stdout.Write(buf.Bytes())
}

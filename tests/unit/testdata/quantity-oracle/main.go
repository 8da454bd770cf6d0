package main

import (
	"bufio"
	"encoding/json"
	"os"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Reads JSON strings, one a line; prints {"in":..., "ok":bool, "err":..., "dec":...}
func main() {
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	for sc.Scan() {
		var s string
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil { panic(err) }
		out := map[string]any{"in": s}
		q, err := resource.ParseQuantity(s)
		if err != nil {
			out["ok"] = false
			out["err"] = err.Error()
		} else {
			out["ok"] = true
			out["ok"] = true
			big := resource.MustParse("1e30")
			neg := resource.MustParse("-1e30")
			if os.Getenv("NODEC") == "" && q.Cmp(big) < 0 && q.Cmp(neg) > 0 {
				out["dec"] = q.AsDec().String()
			}
		}
		b, _ := json.Marshal(out)
		w.Write(b); w.WriteString("\n")
	}
}

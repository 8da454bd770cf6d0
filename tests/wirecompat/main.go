// Command wirecompat talks to a DRA kubelet plugin exactly as the kubelet does: with the generated
// gRPC clients of k8s.io/kubelet (plugin registration, DRA v1 and v1beta1, DRA resource health
// v1alpha1 and v1) over unix sockets, and resolves the returned CDI device IDs with the CDI library
// that container runtimes use. It runs the steps of a JSON plan, checks every answer against the
// plan's expectations, prints a JSON summary on stdout and exits 1 on any mismatch (2 on bad usage).
//
//	wirecompat -plan plan.json             # check mode
//	wirecompat -plan plan.json -bench 1000 # Prepare+Unprepare latency over the plan's bench claims
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Plan is the input: where the plugin is, what it should say, and what to do.
type Plan struct {
	RegistrationSocket string      `json:"registrationSocket"`
	ExpectInfo         *ExpectInfo `json:"expectInfo"`
	DRASocket          string      `json:"draSocket"` // default: the endpoint GetInfo returns
	CDIDir             string      `json:"cdiDir"`
	Steps              []Step      `json:"steps"`
	Bench              *Bench      `json:"bench"`
}

type ExpectInfo struct {
	Name     string   `json:"name"`
	Endpoint string   `json:"endpoint"`
	Versions []string `json:"versions"`
}

// Step is one call (or a call repeated for idempotency) with its expectations.
type Step struct {
	Op         string      `json:"op"`  // prepare | unprepare | health
	API        string      `json:"api"` // v1 | v1beta1 (prepare, unprepare); v1 | v1alpha1 (health)
	Claims     []ClaimCase `json:"claims"`
	Idempotent bool        `json:"idempotent"` // call twice; the second answer must equal the first
	CheckCDI   bool        `json:"checkCDI"`   // prepare: IDs must resolve; unprepare: they must be gone
	Health     *HealthCase `json:"health"`
}

type ClaimCase struct {
	Namespace     string      `json:"namespace"`
	UID           string      `json:"uid"`
	Name          string      `json:"name"`
	ExpectError   string      `json:"expectError"`   // substring of the per-claim error; "" = success
	ExpectDevices []ExpDevice `json:"expectDevices"` // nil: not compared
}

type ExpDevice struct {
	RequestNames []string `json:"requestNames"`
	PoolName     string   `json:"poolName"`
	DeviceName   string   `json:"deviceName"`
	CDIDeviceIDs []string `json:"cdiDeviceIds"`
	ShareID      *string  `json:"shareId,omitempty"` // v1 only
}

type HealthCase struct {
	Count   int         `json:"count"` // expected number of devices in the first message; 0 = any
	Devices []ExpHealth `json:"devices"`
}

type ExpHealth struct {
	PoolName   string `json:"poolName"`
	DeviceName string `json:"deviceName"`
	Health     string `json:"health"`  // UNKNOWN | HEALTHY | UNHEALTHY
	Message    string `json:"message"` // substring
}

type Bench struct {
	API    string      `json:"api"`
	Claims []ClaimCase `json:"claims"`
}

// Summary is the output.
type Summary struct {
	OK         bool           `json:"ok"`
	Mismatches []string       `json:"mismatches"`
	Info       map[string]any `json:"info,omitempty"`
	Steps      []StepResult   `json:"steps"`
	Bench      map[string]any `json:"bench,omitempty"`
}

type StepResult struct {
	Op     string                 `json:"op"`
	API    string                 `json:"api"`
	Claims map[string]ClaimResult `json:"claims,omitempty"`
	Health []GotHealth            `json:"health,omitempty"`
}

type ClaimResult struct {
	Error   string              `json:"error"`
	Devices []ExpDevice         `json:"devices"`
	CDIEnv  map[string][]string `json:"cdiEnv,omitempty"` // CDI ID -> env the runtime would inject
}

type GotHealth struct {
	PoolName           string `json:"poolName"`
	DeviceName         string `json:"deviceName"`
	Health             string `json:"health"`
	LastUpdatedTime    int64  `json:"lastUpdatedTime"`
	HealthCheckTimeout int64  `json:"healthCheckTimeoutSeconds"`
	Message            string `json:"message"`
}

type runner struct {
	plan     Plan
	timeout  time.Duration
	summary  Summary
	draConn  *grpc.ClientConn
	prepared map[string][]string // claim UID -> CDI IDs of its last successful prepare
}

func (r *runner) mismatch(format string, args ...any) {
	r.summary.Mismatches = append(r.summary.Mismatches, fmt.Sprintf(format, args...))
}

func dial(path string) (*grpc.ClientConn, error) {
	// The kubelet's way: target "unix:<absolute path>", no TLS.
	return grpc.NewClient("unix:"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

func (r *runner) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), r.timeout)
}

func (r *runner) register() error {
	if r.plan.RegistrationSocket == "" {
		return nil
	}
	conn, err := dial(r.plan.RegistrationSocket)
	if err != nil {
		return fmt.Errorf("dial registration socket: %w", err)
	}
	defer conn.Close()
	client := registration.NewRegistrationClient(conn)
	ctx, cancel := r.ctx()
	defer cancel()
	info, err := client.GetInfo(ctx, &registration.InfoRequest{})
	if err != nil {
		return fmt.Errorf("GetInfo: %w", err)
	}
	r.summary.Info = map[string]any{"type": info.Type, "name": info.Name, "endpoint": info.Endpoint,
		"supportedVersions": info.SupportedVersions}
	if info.Type != registration.DRAPlugin {
		r.mismatch("GetInfo: type %q, want %q", info.Type, registration.DRAPlugin)
	}
	if want := r.plan.ExpectInfo; want != nil {
		if info.Name != want.Name {
			r.mismatch("GetInfo: name %q, want %q", info.Name, want.Name)
		}
		if info.Endpoint != want.Endpoint {
			r.mismatch("GetInfo: endpoint %q, want %q", info.Endpoint, want.Endpoint)
		}
		if !slices.Equal(info.SupportedVersions, want.Versions) {
			r.mismatch("GetInfo: supported versions %q, want %q", info.SupportedVersions, want.Versions)
		}
	}
	// The kubelet accepts only these service names (pkg/kubelet/cm/dra/plugin); a plugin must offer one.
	known := []string{drav1.DRAPluginService, drav1beta1.DRAPluginService}
	if !slices.ContainsFunc(info.SupportedVersions, func(v string) bool { return slices.Contains(known, v) }) {
		r.mismatch("GetInfo: none of %q is a DRA service the kubelet knows (%q)", info.SupportedVersions, known)
	}
	if _, err := client.NotifyRegistrationStatus(ctx, &registration.RegistrationStatus{PluginRegistered: true}); err != nil {
		r.mismatch("NotifyRegistrationStatus(registered): %v", err)
	}
	if r.plan.DRASocket == "" {
		r.plan.DRASocket = info.Endpoint
	}
	return nil
}

// --- DRA: both API versions answer in the v1 shape ---------------------------------------------

func (r *runner) prepare(api string, claims []ClaimCase) (map[string]*drav1.NodePrepareResourceResponse, error) {
	ctx, cancel := r.ctx()
	defer cancel()
	switch api {
	case "v1":
		resp, err := drav1.NewDRAPluginClient(r.draConn).NodePrepareResources(ctx,
			&drav1.NodePrepareResourcesRequest{Claims: claimsV1(claims)})
		if err != nil {
			return nil, err
		}
		return resp.Claims, nil
	case "v1beta1":
		req := &drav1beta1.NodePrepareResourcesRequest{}
		for _, c := range claims {
			req.Claims = append(req.Claims, &drav1beta1.Claim{Namespace: c.Namespace, Uid: c.UID, Name: c.Name})
		}
		resp, err := drav1beta1.NewDRAPluginClient(r.draConn).NodePrepareResources(ctx, req)
		if err != nil {
			return nil, err
		}
		out := map[string]*drav1.NodePrepareResourceResponse{}
		for uid, c := range resp.Claims {
			if c == nil {
				out[uid] = nil
				continue
			}
			converted := &drav1.NodePrepareResourceResponse{Error: c.Error}
			for _, d := range c.Devices {
				converted.Devices = append(converted.Devices, &drav1.Device{RequestNames: d.RequestNames,
					PoolName: d.PoolName, DeviceName: d.DeviceName, CdiDeviceIds: d.CdiDeviceIds})
			}
			out[uid] = converted
		}
		return out, nil
	}
	return nil, fmt.Errorf("unknown DRA API %q", api)
}

func (r *runner) unprepare(api string, claims []ClaimCase) (map[string]string, error) {
	ctx, cancel := r.ctx()
	defer cancel()
	out := map[string]string{}
	switch api {
	case "v1":
		resp, err := drav1.NewDRAPluginClient(r.draConn).NodeUnprepareResources(ctx,
			&drav1.NodeUnprepareResourcesRequest{Claims: claimsV1(claims)})
		if err != nil {
			return nil, err
		}
		for uid, c := range resp.Claims {
			out[uid] = c.GetError()
		}
	case "v1beta1":
		req := &drav1beta1.NodeUnprepareResourcesRequest{}
		for _, c := range claims {
			req.Claims = append(req.Claims, &drav1beta1.Claim{Namespace: c.Namespace, Uid: c.UID, Name: c.Name})
		}
		resp, err := drav1beta1.NewDRAPluginClient(r.draConn).NodeUnprepareResources(ctx, req)
		if err != nil {
			return nil, err
		}
		for uid, c := range resp.Claims {
			out[uid] = c.GetError()
		}
	default:
		return nil, fmt.Errorf("unknown DRA API %q", api)
	}
	return out, nil
}

func claimsV1(claims []ClaimCase) []*drav1.Claim {
	out := make([]*drav1.Claim, 0, len(claims))
	for _, c := range claims {
		out = append(out, &drav1.Claim{Namespace: c.Namespace, Uid: c.UID, Name: c.Name})
	}
	return out
}

func devicesOf(resp *drav1.NodePrepareResourceResponse) []ExpDevice {
	out := []ExpDevice{}
	for _, d := range resp.GetDevices() {
		out = append(out, ExpDevice{RequestNames: nonNil(d.RequestNames), PoolName: d.PoolName,
			DeviceName: d.DeviceName, CDIDeviceIDs: nonNil(d.CdiDeviceIds), ShareID: d.ShareId})
	}
	return out
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func (r *runner) stepPrepare(step Step, result *StepResult) error {
	answer, err := r.prepare(step.API, step.Claims)
	if err != nil {
		return fmt.Errorf("NodePrepareResources(%s): %w", step.API, err)
	}
	if step.Idempotent {
		again, err := r.prepare(step.API, step.Claims)
		if err != nil {
			return fmt.Errorf("NodePrepareResources(%s), second call: %w", step.API, err)
		}
		for uid, first := range answer {
			if !proto.Equal(first, again[uid]) {
				r.mismatch("prepare %s: claim %s: second call answered %v, first %v", step.API, uid, again[uid], first)
			}
		}
	}
	if len(answer) != len(uniqueUIDs(step.Claims)) {
		r.mismatch("prepare %s: %d claims in the answer, %d asked", step.API, len(answer), len(uniqueUIDs(step.Claims)))
	}
	var cache *cdi.Cache
	if step.CheckCDI {
		if cache, err = r.cdiCache(); err != nil {
			return err
		}
	}
	for _, c := range step.Claims {
		resp, ok := answer[c.UID]
		if !ok || resp == nil {
			r.mismatch("prepare %s: claim %s/%s (%s) missing from the answer", step.API, c.Namespace, c.Name, c.UID)
			continue
		}
		got := ClaimResult{Error: resp.Error, Devices: devicesOf(resp)}
		r.checkError("prepare "+step.API, c, resp.Error)
		if c.ExpectError == "" && resp.Error == "" {
			if c.ExpectDevices != nil {
				want := c.ExpectDevices
				if step.API == "v1beta1" { // v1beta1 has no share IDs on the wire
					want = withoutShareIDs(want)
				}
				if !equalJSON(got.Devices, want) {
					r.mismatch("prepare %s: claim %s devices %s, want %s", step.API, c.UID, toJSON(got.Devices), toJSON(want))
				}
			}
			var ids []string
			for _, d := range got.Devices {
				ids = append(ids, d.CDIDeviceIDs...)
			}
			r.prepared[c.UID] = ids
			if cache != nil {
				got.CDIEnv = r.resolveCDI(cache, step.API, c, ids)
			}
		}
		result.Claims[c.UID] = got
	}
	return nil
}

func (r *runner) checkError(what string, c ClaimCase, got string) {
	switch {
	case c.ExpectError == "" && got != "":
		r.mismatch("%s: claim %s/%s: unexpected error %q", what, c.Namespace, c.Name, got)
	case c.ExpectError != "" && got == "":
		r.mismatch("%s: claim %s/%s: succeeded, want an error containing %q", what, c.Namespace, c.Name, c.ExpectError)
	case c.ExpectError != "" && !strings.Contains(got, c.ExpectError):
		r.mismatch("%s: claim %s/%s: error %q does not contain %q", what, c.Namespace, c.Name, got, c.ExpectError)
	}
}

func (r *runner) stepUnprepare(step Step, result *StepResult) error {
	answer, err := r.unprepare(step.API, step.Claims)
	if err != nil {
		return fmt.Errorf("NodeUnprepareResources(%s): %w", step.API, err)
	}
	if step.Idempotent {
		again, err := r.unprepare(step.API, step.Claims)
		if err != nil {
			return fmt.Errorf("NodeUnprepareResources(%s), second call: %w", step.API, err)
		}
		for uid, first := range answer {
			if again[uid] != first {
				r.mismatch("unprepare %s: claim %s: second call answered %q, first %q", step.API, uid, again[uid], first)
			}
		}
	}
	var cache *cdi.Cache
	if step.CheckCDI {
		if cache, err = r.cdiCache(); err != nil {
			return err
		}
	}
	for _, c := range step.Claims {
		msg, ok := answer[c.UID]
		if !ok {
			r.mismatch("unprepare %s: claim %s/%s (%s) missing from the answer", step.API, c.Namespace, c.Name, c.UID)
			continue
		}
		r.checkError("unprepare "+step.API, c, msg)
		result.Claims[c.UID] = ClaimResult{Error: msg, Devices: []ExpDevice{}}
		if cache != nil && msg == "" {
			for _, id := range r.prepared[c.UID] {
				if cache.GetDevice(id) != nil {
					r.mismatch("unprepare %s: CDI device %s still resolves after unprepare", step.API, id)
				}
			}
		}
	}
	return nil
}

// --- CDI: what a container runtime would do with the IDs ----------------------------------------

func (r *runner) cdiCache() (*cdi.Cache, error) {
	if r.plan.CDIDir == "" {
		return nil, errors.New("checkCDI needs cdiDir in the plan")
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(r.plan.CDIDir), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI cache: %w", err)
	}
	if err := cache.Refresh(); err != nil {
		r.mismatch("CDI: spec directory %s has invalid specs: %v", r.plan.CDIDir, err)
	}
	return cache, nil
}

func (r *runner) resolveCDI(cache *cdi.Cache, api string, c ClaimCase, ids []string) map[string][]string {
	env := map[string][]string{}
	for _, id := range ids {
		device := cache.GetDevice(id)
		if device == nil {
			r.mismatch("prepare %s: claim %s: CDI device %s does not resolve in %s", api, c.UID, id, r.plan.CDIDir)
			continue
		}
		spec := &oci.Spec{Process: &oci.Process{}}
		unresolved, err := cache.InjectDevices(spec, id)
		if err != nil || len(unresolved) > 0 {
			r.mismatch("prepare %s: claim %s: injecting %s: unresolved %q, error %v", api, c.UID, id, unresolved, err)
			continue
		}
		env[id] = spec.Process.Env
	}
	return env
}

// --- health ------------------------------------------------------------------------------------

func (r *runner) stepHealth(step Step, result *StepResult) error {
	ctx, cancel := r.ctx()
	defer cancel()
	var got []GotHealth
	switch step.API {
	case "v1alpha1":
		stream, err := drahealthv1alpha1.NewDRAResourceHealthClient(r.draConn).NodeWatchResources(ctx,
			&drahealthv1alpha1.NodeWatchResourcesRequest{})
		if err != nil {
			return fmt.Errorf("NodeWatchResources(v1alpha1): %w", err)
		}
		msg, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("NodeWatchResources(v1alpha1): first message: %w", err)
		}
		for _, d := range msg.Devices {
			got = append(got, GotHealth{d.GetDevice().GetPoolName(), d.GetDevice().GetDeviceName(), d.Health.String(),
				d.LastUpdatedTime, d.HealthCheckTimeoutSeconds, d.Message})
		}
	case "v1":
		stream, err := drahealthv1.NewDRAResourceHealthClient(r.draConn).NodeWatchResources(ctx,
			&drahealthv1.NodeWatchResourcesRequest{})
		if err != nil {
			return fmt.Errorf("NodeWatchResources(v1): %w", err)
		}
		msg, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("NodeWatchResources(v1): first message: %w", err)
		}
		for _, d := range msg.Devices {
			got = append(got, GotHealth{d.GetDevice().GetPoolName(), d.GetDevice().GetDeviceName(), d.Health.String(),
				d.LastUpdatedTime, d.HealthCheckTimeoutSeconds, d.Message})
		}
	default:
		return fmt.Errorf("unknown health API %q", step.API)
	}
	sort.Slice(got, func(i, j int) bool {
		return got[i].PoolName+"/"+got[i].DeviceName < got[j].PoolName+"/"+got[j].DeviceName
	})
	result.Health = got
	if step.Health == nil {
		return nil
	}
	if step.Health.Count > 0 && len(got) != step.Health.Count {
		r.mismatch("health %s: %d devices in the first message, want %d", step.API, len(got), step.Health.Count)
	}
	for _, want := range step.Health.Devices {
		i := slices.IndexFunc(got, func(g GotHealth) bool { return g.PoolName == want.PoolName && g.DeviceName == want.DeviceName })
		if i < 0 {
			r.mismatch("health %s: device %s/%s not reported", step.API, want.PoolName, want.DeviceName)
			continue
		}
		if got[i].Health != want.Health {
			r.mismatch("health %s: device %s/%s is %s, want %s", step.API, want.PoolName, want.DeviceName, got[i].Health, want.Health)
		}
		if !strings.Contains(got[i].Message, want.Message) {
			r.mismatch("health %s: device %s/%s message %q does not contain %q", step.API, want.PoolName, want.DeviceName,
				got[i].Message, want.Message)
		}
		if got[i].LastUpdatedTime <= 0 {
			r.mismatch("health %s: device %s/%s has no last_updated_time", step.API, want.PoolName, want.DeviceName)
		}
	}
	return nil
}

// --- bench -------------------------------------------------------------------------------------

func (r *runner) bench(n int) error {
	b := r.plan.Bench
	if b == nil || len(b.Claims) == 0 {
		return errors.New("-bench needs bench.claims in the plan")
	}
	// Warm the connection up so the first sample does not include connecting.
	if _, err := r.unprepare(b.API, nil); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	prep, unprep, total := make([]float64, 0, n), make([]float64, 0, n), make([]float64, 0, n)
	for i := 0; i < n; i++ {
		c := b.Claims[i%len(b.Claims)]
		t0 := time.Now()
		answer, err := r.prepare(b.API, []ClaimCase{c})
		if err != nil {
			return fmt.Errorf("bench prepare %d: %w", i, err)
		}
		t1 := time.Now()
		if resp := answer[c.UID]; resp == nil || resp.Error != "" || len(resp.Devices) == 0 {
			r.mismatch("bench prepare %d: claim %s: %v", i, c.UID, resp)
		}
		errs, err := r.unprepare(b.API, []ClaimCase{c})
		if err != nil {
			return fmt.Errorf("bench unprepare %d: %w", i, err)
		}
		t2 := time.Now()
		if msg, ok := errs[c.UID]; !ok || msg != "" {
			r.mismatch("bench unprepare %d: claim %s: %q", i, c.UID, msg)
		}
		prep = append(prep, ms(t1.Sub(t0)))
		unprep = append(unprep, ms(t2.Sub(t1)))
		total = append(total, ms(t2.Sub(t0)))
	}
	r.summary.Bench = map[string]any{"api": b.API, "n": n, "distinctClaims": len(b.Claims),
		"prepareMs": stats(prep), "unprepareMs": stats(unprep), "prepareUnprepareMs": stats(total)}
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func stats(samples []float64) map[string]float64 {
	sorted := slices.Clone(samples)
	sort.Float64s(sorted)
	pick := func(q float64) float64 {
		i := int(q*float64(len(sorted))+0.999999) - 1 // nearest rank
		return sorted[max(0, min(i, len(sorted)-1))]
	}
	sum := 0.0
	for _, s := range sorted {
		sum += s
	}
	round3 := func(v float64) float64 { return math.Round(v*1000) / 1000 }
	return map[string]float64{"p50": pick(0.50), "p90": pick(0.90), "p99": pick(0.99), "max": sorted[len(sorted)-1],
		"mean": round3(sum / float64(len(sorted)))}
}

// --- helpers -----------------------------------------------------------------------------------

func uniqueUIDs(claims []ClaimCase) map[string]bool {
	out := map[string]bool{}
	for _, c := range claims {
		out[c.UID] = true
	}
	return out
}

func withoutShareIDs(devices []ExpDevice) []ExpDevice {
	out := slices.Clone(devices)
	for i := range out {
		out[i].ShareID = nil
	}
	return out
}

func toJSON(v any) string {
	data, _ := json.Marshal(v)
	return string(data)
}

func equalJSON(a, b any) bool { return toJSON(a) == toJSON(b) }

func run(plan Plan, benchN int, timeout time.Duration) Summary {
	r := &runner{plan: plan, timeout: timeout, prepared: map[string][]string{},
		summary: Summary{Mismatches: []string{}, Steps: []StepResult{}}}
	fail := func(err error) Summary {
		r.mismatch("%v", err)
		r.summary.OK = false
		return r.summary
	}
	if err := r.register(); err != nil {
		return fail(err)
	}
	if r.plan.DRASocket == "" {
		return fail(errors.New("no DRA socket: give draSocket or registrationSocket in the plan"))
	}
	conn, err := dial(r.plan.DRASocket)
	if err != nil {
		return fail(fmt.Errorf("dial DRA socket: %w", err))
	}
	defer conn.Close()
	r.draConn = conn
	if benchN > 0 {
		if err := r.bench(benchN); err != nil {
			return fail(err)
		}
	}
	for i, step := range r.plan.Steps {
		result := StepResult{Op: step.Op, API: step.API, Claims: map[string]ClaimResult{}}
		var err error
		switch step.Op {
		case "prepare":
			err = r.stepPrepare(step, &result)
		case "unprepare":
			err = r.stepUnprepare(step, &result)
		case "health":
			err = r.stepHealth(step, &result)
		default:
			err = fmt.Errorf("unknown op %q", step.Op)
		}
		r.summary.Steps = append(r.summary.Steps, result)
		if err != nil {
			return fail(fmt.Errorf("step %d (%s %s): %w", i, step.Op, step.API, err))
		}
	}
	r.summary.OK = len(r.summary.Mismatches) == 0
	return r.summary
}

func main() {
	planFile := flag.String("plan", "-", "JSON plan file, - for stdin")
	benchN := flag.Int("bench", 0, "measure N Prepare+Unprepare round trips over the plan's bench claims")
	timeout := flag.Duration("timeout", 30*time.Second, "deadline of each gRPC call")
	flag.Parse()
	var data []byte
	var err error
	if *planFile == "-" {
		data, err = io.ReadAll(os.Stdin)
	} else {
		data, err = os.ReadFile(*planFile)
	}
	var plan Plan
	if err == nil {
		decoder := json.NewDecoder(strings.NewReader(string(data)))
		decoder.DisallowUnknownFields() // a typo in a plan must not silently skip a check
		err = decoder.Decode(&plan)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "wirecompat: cannot read plan %s: %v\n", *planFile, err)
		os.Exit(2)
	}
	summary := run(plan, *benchN, *timeout)
	out := json.NewEncoder(os.Stdout)
	out.SetIndent("", "  ")
	_ = out.Encode(summary)
	if !summary.OK {
		os.Exit(1)
	}
}

package stripesim

import (
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
)

// routeInfo describes one endpoint: a stable kind for request counters, the
// permission a restricted key needs, and the handler.
type routeInfo struct {
	kind   string
	perm   string
	list   bool
	handle func(s *Server, c *apiCall) response
}

var routes = map[string]routeInfo{
	"POST /v1/customers":                   {perm: "customers_write", handle: (*Server).createCustomer},
	"GET /v1/customers/{id}":               {perm: "customers_read", handle: (*Server).getCustomer},
	"POST /v1/charges":                     {perm: "charges_write", handle: (*Server).createCharge},
	"GET /v1/charges":                      {perm: "charges_read", list: true, handle: (*Server).listCharges},
	"GET /v1/charges/{id}":                 {perm: "charges_read", handle: (*Server).getCharge},
	"POST /v1/payment_intents":             {perm: "payment_intents_write", handle: (*Server).createIntent},
	"GET /v1/payment_intents/{id}":         {perm: "payment_intents_read", handle: (*Server).getIntent},
	"POST /v1/payment_intents/{id}/cancel": {perm: "payment_intents_write", handle: (*Server).cancelIntent},
	"POST /v1/refunds":                     {perm: "refunds_write", handle: (*Server).createRefund},
	"GET /v1/refunds":                      {perm: "refunds_read", list: true, handle: (*Server).listRefunds},
	"GET /v1/refunds/{id}":                 {perm: "refunds_read", handle: (*Server).getRefund},
	"POST /v1/charges/{id}":                {perm: "charges_write", handle: (*Server).updateCharge},

	"POST /v1/billing/meters":                     {perm: "billing_meters_write", handle: (*Server).createMeter},
	"GET /v1/billing/meters":                      {perm: "billing_meters_read", list: true, handle: (*Server).listMeters},
	"GET /v1/billing/meters/{id}":                 {perm: "billing_meters_read", handle: (*Server).getMeter},
	"GET /v1/billing/meters/{id}/event_summaries": {perm: "billing_meters_read", list: true, handle: (*Server).listMeterSummaries},
	"POST /v1/billing/meter_events":               {perm: "billing_meter_events_write", handle: (*Server).createMeterEvent},
	"POST /v1/billing/meter_event_adjustments":    {perm: "billing_meter_events_write", handle: (*Server).createMeterAdjustment},
}

// namespaces are the path segments Stripe puts before a resource
// (/v1/billing/meters): they belong to the resource's name, not its id.
var namespaces = []string{"billing"}

func init() {
	for k, v := range routes {
		v.kind = k
		routes[k] = v
	}
}

// route maps a method and path to an endpoint; the second result is the path
// id for /v1/<resource>/{id}.
func route(method, path string) (routeInfo, string, bool) {
	rest, ok := strings.CutPrefix(path, "/v1/")
	if !ok {
		return routeInfo{}, "", false
	}
	ns := ""
	for _, n := range namespaces {
		if after, ok := strings.CutPrefix(rest, n+"/"); ok {
			ns, rest = n+"/", after
			break
		}
	}
	resource, id, hasID := strings.Cut(rest, "/")
	pattern := method + " /v1/" + ns + resource
	if hasID {
		id, action, hasAction := strings.Cut(id, "/")
		if id == "" || (hasAction && (action == "" || strings.Contains(action, "/"))) {
			return routeInfo{}, "", false
		}
		pattern += "/{id}"
		if hasAction {
			pattern += "/" + action
		}
		rt, ok := routes[pattern]
		return rt, id, ok
	}
	rt, ok := routes[pattern]
	return rt, id, ok
}

// formValues are the decoded form parameters of a request (query string for
// GET, body for POST), as stripe-go encodes them: metadata[k]=v,
// expand[0]=..., created[gt]=....
type formValues url.Values

func parseForm(r *http.Request) (formValues, error) {
	if err := r.ParseForm(); err != nil {
		return nil, err
	}
	return formValues(r.Form), nil
}

func (f formValues) get(k string) string { return url.Values(f).Get(k) }

func (f formValues) has(k string) bool { _, ok := f[k]; return ok }

// sub collects bracketed sub-keys: sub("metadata") of metadata[a]=1 gives
// {"a": "1"}. A bare metadata= (stripe-go's way to clear) gives an empty map.
func (f formValues) sub(prefix string) map[string]string {
	out := map[string]string{}
	for k, v := range f {
		rest, ok := strings.CutPrefix(k, prefix+"[")
		if !ok || !strings.HasSuffix(rest, "]") || len(v) == 0 {
			continue
		}
		out[strings.TrimSuffix(rest, "]")] = v[0]
	}
	return out
}

// list collects array parameters: expand[0]=a&expand[1]=b or expand[]=a.
func (f formValues) list(prefix string) []string {
	type kv struct {
		idx string
		v   string
	}
	var items []kv
	for k, vs := range f {
		rest, ok := strings.CutPrefix(k, prefix+"[")
		if !ok || !strings.HasSuffix(rest, "]") {
			continue
		}
		for _, v := range vs {
			items = append(items, kv{strings.TrimSuffix(rest, "]"), v})
		}
	}
	sort.Slice(items, func(i, j int) bool {
		a, _ := strconv.Atoi(items[i].idx)
		b, _ := strconv.Atoi(items[j].idx)
		return a < b
	})
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.v
	}
	return out
}

func (f formValues) expands(path string) bool {
	for _, e := range f.list("expand") {
		if e == path {
			return true
		}
	}
	return false
}

// int64Param parses an integer parameter; ok is false when absent.
func (f formValues) int64Param(k string) (v int64, ok bool, resp response) {
	s := f.get(k)
	if !f.has(k) {
		return 0, false, response{}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, false, invalidRequest(http.StatusBadRequest, k, fmt.Sprintf("Invalid integer: %s", s))
	}
	return v, true, response{}
}

func (f formValues) boolParam(k string) bool {
	b, _ := strconv.ParseBool(f.get(k))
	return b
}

// fingerprint identifies a request's parameters for the idempotency
// mismatch check. url.Values.Encode sorts keys, so the same parameters
// encoded in a different order (e.g. Go map iteration over metadata) match.
func fingerprint(method, path string, f formValues) string {
	return method + " " + path + "?" + url.Values(f).Encode()
}

// metadataParam validates metadata like Stripe: at most 50 keys, keys up to
// 40 characters, values up to 500.
func metadataParam(f formValues) (map[string]string, response, bool) {
	md := f.sub("metadata")
	if len(md) > 50 {
		return nil, invalidRequest(http.StatusBadRequest, "metadata", "Invalid metadata: metadata cannot have more than 50 keys"), false
	}
	for k, v := range md {
		if len(k) > 40 {
			return nil, invalidRequest(http.StatusBadRequest, "metadata", "Invalid metadata: keys can be at most 40 characters long"), false
		}
		if len(v) > 500 {
			return nil, invalidRequest(http.StatusBadRequest, "metadata", "Invalid metadata: values can be at most 500 characters long"), false
		}
	}
	return md, response{}, true
}

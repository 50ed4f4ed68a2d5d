package stripesim

import (
	"net/http"
	"slices"
	"sort"
)

// sortKey orders objects the way Stripe lists them (newest first): by
// created, ties broken by insertion sequence so the order is total and
// stable and cursors never skip or repeat an object.
type sortKey struct {
	created int64
	seq     uint64
}

func (a sortKey) less(b sortKey) bool {
	if a.created != b.created {
		return a.created < b.created
	}
	return a.seq < b.seq
}

type keyed interface{ sortKey() sortKey }

// index keeps objects ascending by sortKey. Appends in clock order are O(1);
// an out-of-order insert (SeedCharge with an old time, a clock set back)
// only marks it unsorted, and the next list sorts once: seeding 100k
// charges in random order costs one sort, not 100k memmoves.
type index[T keyed] struct {
	items    []T
	unsorted bool
}

func (ix *index[T]) add(v T) {
	if n := len(ix.items); n > 0 && v.sortKey().less(ix.items[n-1].sortKey()) {
		ix.unsorted = true
	}
	ix.items = append(ix.items, v)
}

func (ix *index[T]) sort() {
	if ix.unsorted {
		slices.SortFunc(ix.items, func(a, b T) int {
			ka, kb := a.sortKey(), b.sortKey()
			switch {
			case ka.less(kb):
				return -1
			case kb.less(ka):
				return 1
			}
			return 0
		})
		ix.unsorted = false
	}
}

// listQuery is a parsed Stripe list request.
type listQuery struct {
	limit         int
	minCreated    int64 // inclusive
	maxCreated    int64 // inclusive
	startingAfter string
	endingBefore  string
}

const (
	defaultLimit = 10
	maxLimit     = 100
)

// parseListQuery reads limit, created / created[gt|gte|lt|lte],
// starting_after and ending_before like Stripe, including its 400s.
func parseListQuery(f formValues) (listQuery, response, bool) {
	q := listQuery{limit: defaultLimit, minCreated: -1 << 62, maxCreated: 1 << 62}
	if v, ok, resp := f.int64Param("limit"); resp.status != 0 {
		return q, resp, false
	} else if ok {
		if v < 1 || v > maxLimit {
			return q, invalidRequest(http.StatusBadRequest, "limit",
				"This value must be greater than or equal to 1 and less than or equal to 100."), false
		}
		q.limit = int(v)
	}
	for _, b := range []struct {
		param string
		apply func(int64)
	}{
		{"created", func(v int64) { q.minCreated, q.maxCreated = max(q.minCreated, v), min(q.maxCreated, v) }},
		{"created[gt]", func(v int64) { q.minCreated = max(q.minCreated, v+1) }},
		{"created[gte]", func(v int64) { q.minCreated = max(q.minCreated, v) }},
		{"created[lt]", func(v int64) { q.maxCreated = min(q.maxCreated, v-1) }},
		{"created[lte]", func(v int64) { q.maxCreated = min(q.maxCreated, v) }},
	} {
		v, ok, resp := f.int64Param(b.param)
		if resp.status != 0 {
			return q, resp, false
		}
		if ok {
			b.apply(v)
		}
	}
	q.startingAfter = f.get("starting_after")
	q.endingBefore = f.get("ending_before")
	if q.startingAfter != "" && q.endingBefore != "" {
		return q, invalidRequest(http.StatusBadRequest, "ending_before",
			"You may only specify one of these parameters: starting_after, ending_before."), false
	}
	return q, response{}, true
}

// page selects one page, newest first, from items sorted ascending. cursor
// is the sortKey of the starting_after / ending_before object (which need not
// be in items: keys order every object of the type).
func page[T keyed](items []T, q listQuery, cursor *sortKey) (out []T, hasMore bool) {
	lo := sort.Search(len(items), func(i int) bool { return items[i].sortKey().created >= q.minCreated })
	hi := sort.Search(len(items), func(i int) bool { return items[i].sortKey().created > q.maxCreated })
	if cursor != nil && q.startingAfter != "" {
		hi = min(hi, sort.Search(len(items), func(i int) bool { return !items[i].sortKey().less(*cursor) }))
	}
	if cursor != nil && q.endingBefore != "" {
		lo = max(lo, sort.Search(len(items), func(i int) bool { return cursor.less(items[i].sortKey()) }))
	}
	if lo >= hi {
		return nil, false
	}
	var start, end int
	if q.endingBefore != "" {
		// The page just newer than the cursor, still returned newest first;
		// stripe-go reverses it while iterating backwards.
		start, end = lo, min(lo+q.limit, hi)
		hasMore = end < hi
	} else {
		start, end = max(hi-q.limit, lo), hi
		hasMore = start > lo
	}
	out = make([]T, 0, end-start)
	for i := end - 1; i >= start; i-- {
		out = append(out, items[i])
	}
	return out, hasMore
}

// listEnvelope is Stripe's list object.
type listEnvelope struct {
	Object  string `json:"object"`
	Data    []any  `json:"data"`
	HasMore bool   `json:"has_more"`
	URL     string `json:"url"`
}

// listResource describes one list endpoint for listPage: the index to page
// through, chosen under the read lock (nil when the filter names an object
// that does not exist: an empty list), how to find the cursor object, and
// how to render an item. Every func runs under the store's read lock.
type listResource[T keyed] struct {
	object string // "charge", for the cursor's 400
	url    string // "/v1/charges"
	pick   func() *index[T]
	lookup func(id string) (T, bool)
	render func(T) any
}

// listPage serves one page of a Stripe list: newest first, cursors and
// created filters from q. Cost is O(log n + limit) whatever the index size.
func listPage[T keyed](st *store, q listQuery, r listResource[T]) response {
	st.rlockSorted(func() []sorter {
		if ix := r.pick(); ix != nil {
			return []sorter{ix}
		}
		return nil
	})
	defer st.mu.RUnlock()
	var cursor *sortKey
	if id := q.startingAfter + q.endingBefore; id != "" {
		v, ok := r.lookup(id)
		if !ok {
			resp := missing(r.object, cmpParam(q), id)
			resp.status = http.StatusBadRequest
			return resp
		}
		k := v.sortKey()
		cursor = &k
	}
	env := listEnvelope{Object: "list", URL: r.url, Data: []any{}}
	if ix := r.pick(); ix != nil {
		items, more := page(ix.items, q, cursor)
		env.HasMore = more
		env.Data = make([]any, len(items))
		for i, v := range items {
			env.Data[i] = r.render(v)
		}
	}
	return jsonResp(env)
}

func cmpParam(q listQuery) string {
	if q.startingAfter != "" {
		return "starting_after"
	}
	return "ending_before"
}

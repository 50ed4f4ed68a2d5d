// Package secret is the fixture's internal package: every type here is one
// that another module could neither name nor build.
package secret

// Store is what a leaky Config asks for.
type Store struct{}

// NewStore returns a Store.
func NewStore() *Store { return &Store{} }

// Token is a small value type.
type Token string

// Count is a typed integer, for a typed constant.
type Count int

// Limit is a typed constant.
const Limit Count = 3

// Plain is an untyped constant.
const Plain = 4

// Embedded is a struct to embed.
type Embedded struct{ N int }

// Runner is an interface to embed.
type Runner interface{ Run() }

// Inner has a method that promotion carries into an embedding type.
type Inner struct{}

// Get returns a Token.
func (*Inner) Get() Token { return "" }

// Number is a constraint.
type Number interface{ ~int | ~int64 }

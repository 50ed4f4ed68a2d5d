// Package pub leaks secret's types in every way apicheck looks for, beside
// uses of them that are not leaks (unexported identifiers, function bodies).
package pub

import "example.com/leak/internal/secret"

// Config leaks through fields.
type Config struct {
	Store           *secret.Store             // leak
	ByName          map[string][]secret.Token // leak, through a map and a slice
	Keyed           map[secret.Token]bool     // leak, through a map key
	OnDone          func(secret.Token) error  // leak, a func field's parameter
	Nested          nested                    // leak, through an unexported type's field
	Hooks           Hooks                     // reported at Hooks itself
	Anon            struct{ T secret.Token }  // leak, through a struct literal
	secret.Embedded                           // leak, an exported embedded field
	opts            options                   // not exported: not reachable
	store           *secret.Store             // not exported
	Fine            int                       // fine
}

// Hooks leaks through a channel.
type Hooks struct {
	After chan<- secret.Token // leak
}

type nested struct {
	Deep   secret.Token // leak, as Config.Nested.Deep
	hidden secret.Token
}

type options struct {
	Unreachable secret.Token // only reachable through Config.opts
}

// Service leaks through its methods and an embedded interface.
type Service interface {
	Do(t secret.Token) error // leak
	secret.Runner            // leak
}

// Alias is an alias of an internal type: a leak.
type Alias = secret.Token

// Box is generic; Boxed instantiates it with an internal type.
type Box[T any] struct{ V T }

// Boxed leaks through a type argument.
var Boxed Box[secret.Token]

// Default leaks through a variable's type.
var Default = secret.NewStore()

// Limit leaks through a typed constant.
const Limit = secret.Limit

// Plain is an untyped constant: fine.
const Plain = secret.Plain

// Open leaks through a parameter.
func Open(s *secret.Store) {}

// Make leaks through a result.
func Make() (secret.Token, error) { return "", nil }

// Sum leaks through a constraint.
func Sum[T secret.Number](xs ...T) T { return 0 }

// Uses uses secret only in its body: fine.
func Uses() int { return secret.Plain + int(secret.Limit) }

// Client leaks through a method.
type Client struct{ s *secret.Store }

// Store leaks through a method result.
func (c *Client) Store() *secret.Store { return c.s }

func (c *Client) token() secret.Token { return "" }

// Wrapper leaks through an embedded field and the method it promotes.
type Wrapper struct {
	*secret.Inner
}

type hiddenAPI struct{ T secret.Token }

// notExported is fine: nothing exported reaches it.
func notExported(h hiddenAPI) secret.Token { return h.T }

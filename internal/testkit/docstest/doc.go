// Package docstest holds tests of the documentation itself: every relative
// link in README.md and docs/ resolves, and README's quick start runs as
// written. It has no code of its own; it is test kit, not product.
package docstest

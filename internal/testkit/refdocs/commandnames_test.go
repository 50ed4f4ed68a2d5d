package refdocs

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/cmdname"
)

// TestNamedCommandsParse reads every text an operator is shown — the
// Markdown docs (README.md, docs/**, each package's and cmd/*'s README),
// every command's --help, and every string literal of the non-test Go
// sources (alert templates, reasons, log hints, errors, stripesim's and the
// drill's help) — and checks each command named in it: a pelguard command
// must be typed with its installed name (`pelguard-consumer replay`, never
// `consumer replay`), name a real command and verb, and give only flags
// that command's flag set registers, with a value where the flag takes one.
// The flag sets are the real ones, as each command's own --help prints
// them (HelpOf).
func TestNamedCommandsParse(t *testing.T) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "" && !keepEnv[k] {
			t.Setenv(k, "")
		}
	}
	progs := loadPrograms(t)
	texts := userTexts(t, progs)
	if len(texts) < 100 {
		t.Fatalf("only %d texts read: the walk over docs, help and sources is broken", len(texts))
	}
	checked := 0
	// The auditor's summary alert builds its refund command from a
	// prefix: the prefix must be the binary.
	texts = append(texts, text{where: "audit.DefaultCommandName", body: "`" + audit.DefaultCommandName + " refund --all --max-refunds 3 --max-cents 6500`"})
	for _, tx := range texts {
		for _, cand := range candidates(tx) {
			n, errs := checkCandidate(progs, cand.text)
			checked += n
			for _, e := range errs {
				t.Errorf("%s: %q: %s", tx.where, cand.text, e)
			}
		}
	}
	// Docs and alerts name well over a hundred commands: far fewer means
	// the extraction stopped finding them, and the test would pass empty.
	if checked < 100 {
		t.Fatalf("only %d named commands checked", checked)
	}
	t.Logf("%d named commands checked in %d texts", checked, len(texts))
}

// TestNamedCommandsCatchesBadOnes keeps the checker honest: each of these
// must be reported.
func TestNamedCommandsCatchesBadOnes(t *testing.T) {
	progs := loadPrograms(t)
	for _, bad := range []string{
		"consumer replay --reason spend_cap",              // not the installed name
		"auditor refund 12",                               // idem
		"pelguard-consumer replay --no-such-flag",         // unknown flag
		"pelguard-consumer cap sett --period 2026-01",     // unknown verb
		"pelguard-auditor refundd 12",                     // unknown command
		"pelguard-consumer meter-events --no-such",        // idem, another command
		"pelguard-reaper --stream s=g --dry-run=maybe",    // a bool's bad value
		"pelguard-consumer retry --period P extra",        // a positional it takes none of
		"go run ./cmd/consumer replay --reason spend_cap", // the source path, not the binary
	} {
		if _, errs := checkCandidate(progs, bad); len(errs) == 0 {
			t.Errorf("%q passed the check", bad)
		}
	}
	for _, good := range []string{
		"pelguard-consumer replay --stream usage-stream --reason spend_cap",
		"pelguard-consumer cap set --period P --cents N",
		"pelguard-auditor refund ID --dry-run",
		"PELGUARD_X=1 ./bin/pelguard-reaper --once --dry-run | jq .",
		"pelguard-consumer meter-cap",
	} {
		if n, errs := checkCandidate(progs, good); n != 1 || len(errs) > 0 {
			t.Errorf("%q: %d checked, %v", good, n, errs)
		}
	}
}

// program is one installed binary: its commands and, per command, its
// flags (name → takes a value) as its --help prints them.
type program struct {
	p     *cli.Program
	flags map[string]map[string]bool
}

func loadPrograms(t *testing.T) map[string]*program {
	t.Helper()
	ctx := context.Background()
	out := map[string]*program{}
	for _, bin := range binaries {
		pr := &program{p: bin.program(), flags: map[string]map[string]bool{}}
		for _, c := range pr.p.Commands {
			u, err := HelpOf(ctx, c)
			if err != nil {
				t.Fatalf("%s %s: %v", bin.installed, c.Name, err)
			}
			m := map[string]bool{"help": false, "h": false}
			for _, f := range u.Flags {
				m[f.Name] = f.Placeholder != ""
			}
			pr.flags[c.Name] = m
		}
		out[bin.installed] = pr
	}
	return out
}

// text is one thing an operator reads, and where it comes from.
type text struct {
	where, body string
	markdown    bool
}

// userTexts gathers the docs, the help and the source literals.
func userTexts(t *testing.T, progs map[string]*program) []text {
	t.Helper()
	var out []text
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if name := d.Name(); rel != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || name == "bin" || name == "dist") {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case strings.HasSuffix(path, ".md"):
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			out = append(out, text{where: rel, body: string(b), markdown: true})
		case strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") && !strings.Contains(rel, "testkit"):
			lits, err := stringLiterals(path)
			if err != nil {
				return err
			}
			for _, l := range lits {
				out = append(out, text{where: rel + ":" + strconv.Itoa(l.line), body: l.s})
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for name, pr := range progs {
		for _, c := range pr.p.Commands {
			var b bytes.Buffer
			c.Run(ctx, []string{"--help"}, &b, &b)
			out = append(out, text{where: name + " " + c.Name + " --help", body: b.String()})
		}
	}
	return out
}

// names are cmdname's constants, as the sources refer to them.
var names = map[string]string{
	"Consumer": cmdname.Consumer, "Reaper": cmdname.Reaper, "Auditor": cmdname.Auditor,
	"Console": cmdname.Console, "Stripesim": cmdname.Stripesim, "Chaos": cmdname.Chaos,
}

type literal struct {
	s    string
	line int
}

// stringLiterals returns a Go file's string literals, adjacent ones joined
// ("a" + "b"), so that a sentence split over lines reads whole.
func stringLiterals(path string) ([]literal, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, 0)
	if err != nil {
		return nil, err
	}
	var out []literal
	var join func(e ast.Expr) (string, bool)
	join = func(e ast.Expr) (string, bool) {
		switch e := e.(type) {
		case *ast.BasicLit:
			if e.Kind != token.STRING {
				return "", false
			}
			s, err := strconv.Unquote(e.Value)
			return s, err == nil
		case *ast.BinaryExpr:
			if e.Op != token.ADD {
				return "", false
			}
			l, ok1 := join(e.X)
			r, ok2 := join(e.Y)
			if !ok1 && !ok2 {
				return "", false
			}
			return l + "\x00" + r, true // \x00: a non-literal part may be between
		case *ast.SelectorExpr:
			// cmdname.Consumer: the installed name the text prints.
			if x, ok := e.X.(*ast.Ident); ok && x.Name == "cmdname" {
				v, ok := names[e.Sel.Name]
				return v, ok
			}
		}
		return "", false
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BinaryExpr:
			if s, ok := join(n); ok {
				out = append(out, literal{s, fset.Position(n.Pos()).Line})
				return false
			}
		case *ast.BasicLit:
			if s, ok := join(n); ok {
				out = append(out, literal{s, fset.Position(n.Pos()).Line})
			}
		case *ast.ImportSpec:
			return false
		}
		return true
	})
	return out, nil
}

type candidate struct{ text string }

var (
	fence      = regexp.MustCompile("(?m)^\\s*```")
	inlineCode = regexp.MustCompile("`([^`\n]+)`")
	quoted     = regexp.MustCompile(`'((?:pelguard-|consumer |reaper |auditor |console |go run )[^'\n]+)'`)
	indented   = regexp.MustCompile(`(?m)^ {4,}(\S.*)$`) // not "    \t": a flag's usage
)

// candidates are the places a command may be written: Markdown's fenced
// blocks and inline code; in help and sources, `backquoted` and 'quoted'
// spans and indented lines. Shell continuations (\ at a line's end) join.
func candidates(tx text) []candidate {
	var out []candidate
	body := strings.ReplaceAll(tx.body, "\\\n", " ")
	if tx.markdown {
		parts := fence.Split(body, -1)
		for i, p := range parts {
			if i%2 == 1 { // inside a fence
				for _, line := range strings.Split(p, "\n") {
					out = append(out, candidate{line})
				}
				continue
			}
			for _, m := range inlineCode.FindAllStringSubmatch(p, -1) {
				out = append(out, candidate{m[1]})
			}
		}
		return out
	}
	for _, m := range inlineCode.FindAllStringSubmatch(body, -1) {
		out = append(out, candidate{m[1]})
	}
	for _, m := range quoted.FindAllStringSubmatch(body, -1) {
		out = append(out, candidate{m[1]})
	}
	for _, m := range indented.FindAllStringSubmatch(body, -1) {
		out = append(out, candidate{m[1]})
	}
	// Help text without marks: "Run 'pelguard-consumer COMMAND --help'"
	// is quoted above; a bare sentence naming a command is left alone.
	return out
}

var bareRoles = map[string]string{
	"consumer": cmdname.Consumer, "reaper": cmdname.Reaper,
	"auditor": cmdname.Auditor, "console": cmdname.Console,
}

// separators end a command on a shell line.
var separators = map[string]bool{"|": true, "||": true, "&&": true, ";": true, "&": true, ">": true, ">>": true, "2>&1": true, "<": true, "#": true, "\\": true}

// checkCandidate finds the pelguard commands in s and checks each; it
// returns how many it checked and what is wrong.
func checkCandidate(progs map[string]*program, s string) (int, []string) {
	// Two spaces end a command: what follows is a column of comments
	// ("pelguard-auditor findings [flags]   list findings").
	s = strings.TrimSpace(s)
	if i := strings.Index(s, "  "); i >= 0 {
		s = s[:i]
	}
	toks := shellFields(s)
	var errs []string
	n := 0
	for i := 0; i < len(toks); i++ {
		tok := toks[i]
		base := tok[strings.LastIndex(tok, "/")+1:]
		// Units and output paths name the binary, not a command:
		// `systemctl restart pelguard-consumer`, `go build -o bin/pelguard-reaper`.
		if tok == "systemctl" || tok == "journalctl" {
			return n, errs
		}
		if pr, ok := progs[base]; ok && (i == 0 || toks[i-1] != "-o") {
			end := i + 1
			for end < len(toks) && !separators[toks[end]] && !strings.HasPrefix(toks[end], "#") {
				end++
			}
			n++
			if err := pr.check(toks[i+1 : end]); err != nil {
				errs = append(errs, err.Error())
			}
			i = end
			continue
		}
		// `consumer replay …`, `go run ./cmd/consumer replay …` at the
		// start of a command: not what is installed.
		start := i == 0 || separators[toks[i-1]] || toks[i-1] == "sudo" || isEnvAssign(toks[i-1])
		if tok == "go" && i+2 < len(toks) && toks[i+1] == "run" && strings.HasPrefix(toks[i+2], "./cmd/") {
			if role := strings.TrimPrefix(toks[i+2], "./cmd/"); bareRoles[role] != "" {
				errs = append(errs, fmt.Sprintf("`go run ./cmd/%s` names the source, not the installed %s", role, bareRoles[role]))
				n++
			}
			continue
		}
		if installed, ok := bareRoles[tok]; ok && start && i+1 < len(toks) {
			next := toks[i+1]
			if strings.HasPrefix(next, "--") || progs[installed].p != nil && progs[installed].lookup(next) {
				errs = append(errs, fmt.Sprintf("%q is not an installed command: type %s", tok, installed))
				n++
			}
		}
	}
	return n, errs
}

func isEnvAssign(s string) bool {
	k, _, ok := strings.Cut(s, "=")
	return ok && k != "" && strings.ToUpper(k) == k && !strings.HasPrefix(k, "-")
}

func (pr *program) lookup(name string) bool {
	for _, c := range pr.p.Commands {
		if c.Name == name {
			return true
		}
	}
	return false
}

// placeholder reports whether a word stands for something to fill in:
// ID, P, N, REASON, <id>, …, [flags].
func placeholder(s string) bool {
	if s == "…" || s == "..." || strings.Contains(s, "…") || strings.HasPrefix(s, "<") || s == "%s" || s == "%d" || strings.Contains(s, "%") {
		return true
	}
	if s == "" {
		return true
	}
	for _, r := range s {
		if unicode.IsLower(r) {
			return false
		}
	}
	return true
}

// check parses args as the program would: the command (the default one
// when args start with a flag), its verb, its flags.
func (pr *program) check(args []string) error {
	// Synopsis marks: [--limit N] is an optional flag, a|b alternatives.
	var words []string
	for _, a := range args {
		a = strings.Trim(a, "[](),.")
		if a == "" || a == "flags" || a == "…" || a == "..." {
			continue
		}
		words = append(words, a)
	}
	name := pr.p.Commands[0].Name
	if len(words) > 0 && !strings.HasPrefix(words[0], "-") {
		switch w := words[0]; {
		case w == "help" || w == "version" || w == "COMMAND":
			return nil
		case pr.lookup(w):
			name, words = w, words[1:]
		case placeholder(w):
			return nil // `pelguard-consumer COMMAND`
		default:
			return fmt.Errorf("%s has no command %q", pr.p.Name, w)
		}
	}
	var cmd cli.Command
	for _, c := range pr.p.Commands {
		if c.Name == name {
			cmd = c
		}
	}
	// A verb: "set|show [flags]", "up|down|status|move".
	if first, _, _ := strings.Cut(cmd.Args, " "); strings.Contains(first, "|") && !strings.ContainsAny(first, "-ABCDEFGHIJKLMNOPQRSTUVWXYZ") {
		verbs := strings.Split(first, "|")
		if len(words) > 0 && !strings.HasPrefix(words[0], "-") {
			for _, alt := range strings.Split(words[0], "|") {
				if !contains(verbs, alt) && !placeholder(alt) {
					return fmt.Errorf("%s %s has no verb %q (want %s)", pr.p.Name, name, alt, first)
				}
			}
			words = words[1:]
		}
	}
	takesPositional := cmd.Args != "" && unicode.IsUpper(rune(cmd.Args[0]))
	known := pr.flags[name]
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	for f, value := range known {
		if value {
			fs.String(f, "", "")
		} else {
			fs.Bool(f, false, "")
		}
	}
	// Alternatives ("ID|--all") and flags after a positional: check each
	// flag on its own, then the rest as the flag package parses it.
	var rest []string
	for _, w := range words {
		if strings.Contains(w, "|") && !strings.Contains(w, "=") {
			for _, alt := range strings.Split(w, "|") {
				if strings.HasPrefix(alt, "-") {
					if _, ok := known[strings.TrimLeft(alt, "-")]; !ok {
						return fmt.Errorf("%s %s has no flag %s", pr.p.Name, name, alt)
					}
				}
			}
			if !takesPositional {
				continue
			}
			w = "ID"
		}
		rest = append(rest, w)
	}
	// A flag named last without its value is the flag's name in a
	// sentence: "`pelguard-reaper --external-ledger`".
	if n := len(rest); n > 0 && strings.HasPrefix(rest[n-1], "--") && !strings.Contains(rest[n-1], "=") && known[strings.TrimPrefix(rest[n-1], "--")] {
		rest = append(rest, "X")
	}
	for len(rest) > 0 {
		if err := fs.Parse(rest); err != nil {
			return fmt.Errorf("%s %s: %v", pr.p.Name, name, err)
		}
		rest = fs.Args()
		if len(rest) == 0 {
			break
		}
		if !takesPositional && !placeholder(rest[0]) {
			return fmt.Errorf("%s %s takes no argument %q", pr.p.Name, name, rest[0])
		}
		rest = rest[1:]
	}
	return nil
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// shellFields splits a command line as a shell would, near enough: quotes
// group, and a quoted value is one word without its quotes.
func shellFields(s string) []string {
	var out []string
	var cur strings.Builder
	var quote rune
	in := false
	for _, r := range strings.ReplaceAll(s, "\x00", " X ") {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, in = r, true
		case unicode.IsSpace(r):
			if in {
				out = append(out, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if in {
		out = append(out, cur.String())
	}
	return out
}

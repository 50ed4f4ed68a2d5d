package refdocs

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/pelguard/pelguard/chaos"
)

// historyWords are words of this project's history, not of its users: an
// operator reading the docs, a --help or an alert has read no "seed" or
// "article" and cannot look up "issue 29".
var historyWords = regexp.MustCompile(`(?i)\bthe seeds?\b|\bseeds?'s?(\s|$)|\bseed article\b|\b(the|this) article\b|\barticle's\b|\bissues? #?\d+\b`)

// TestUserWordsSpeakToOperators reads what TestNamedCommandsParse reads
// (every doc, --help and source string literal) and the drill's HTML
// report, and fails on the project's history words.
func TestUserWordsSpeakToOperators(t *testing.T) {
	progs := loadPrograms(t)
	texts := userTexts(t, progs)
	var page bytes.Buffer
	rep := chaos.Report{Events: 10, Seed: 1}
	for _, s := range chaos.Scenarios {
		if s.Usage {
			rep.Usage = append(rep.Usage, chaos.UsageResult{Scenario: s.Name, Mode: chaos.ModePelguard})
		} else {
			rep.Results = append(rep.Results, chaos.Result{Scenario: s.Name, Mode: chaos.ModeNaive})
		}
	}
	if err := rep.WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	texts = append(texts, text{where: "the drill's HTML report", body: page.String()})
	// `make help` prints the Makefile's ## lines.
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	texts = append(texts, text{where: "Makefile", body: string(mk)})
	for _, tx := range texts {
		for _, m := range historyWords.FindAllStringIndex(tx.body, -1) {
			from, to := max(0, m[0]-40), min(len(tx.body), m[1]+40)
			t.Errorf("%s: %q: say what is meant (\"a naive consumer\", \"the common pattern\"), not the project's history", tx.where, tx.body[from:to])
		}
	}
	if !historyWords.MatchString("written as the seed's naive code shows") || !historyWords.MatchString("see issue 29") ||
		historyWords.MatchString("--seed 1: seed for fault decisions") {
		t.Fatal("historyWords does not catch its own examples")
	}
}

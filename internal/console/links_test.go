package console

import (
	"html"
	"regexp"
	"strings"
	"testing"
)

// Links carry a stream's name escaped once: the tests' stream names have
// colons ("console:TestX:…"), as many teams' do ("billing:events"), and a
// link escaped twice names a stream the console does not show.
func TestLinksEscapeStreamNamesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	alice := b.login(t, "alice")
	m := regexp.MustCompile(`href="(/dead\?stream=[^"]+)"`).FindStringSubmatch(alice.mustGet("/"))
	if m == nil {
		t.Fatal("no dead-letter link on the overview")
	}
	link := html.UnescapeString(m[1])
	if strings.Contains(link, "%25") {
		t.Errorf("link escaped twice: %s", link)
	}
	if page := alice.mustGet(link); !strings.Contains(page, b.stream) {
		t.Errorf("%s does not show stream %s", link, b.stream)
	}
}

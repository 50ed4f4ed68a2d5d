package alerts

import (
	"cmp"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/slack-go/slack"
)

// Slack's Block Kit limits (https://api.slack.com/reference/block-kit).
const (
	maxBlocks       = 50
	maxSectionText  = 3000
	maxHeaderText   = 150
	maxFieldText    = 2000
	maxFieldsPerSec = 10
	// maxFallbackText keeps the notification text short; Slack truncates
	// chat.postMessage text at 40,000 characters but notifications show far less.
	maxFallbackText = 3000
)

// message is an alert rendered for Slack: Block Kit blocks plus the plain
// text that notifications, screen readers and old clients show.
type message struct {
	Text   string
	Blocks []slack.Block
}

// maxFields bounds the label/value pairs shown, so that fields can never
// take the blocks the items and the command need.
const maxFields = 5 * maxFieldsPerSec

// render turns a into a message within Slack's limits. Every string passes
// through Redact here, after the constructors, so no path to Slack skips it.
// threaded says whether the items will also be posted in the thread.
func render(a Alert, threaded bool) message {
	var blocks []slack.Block
	title := cutRunes(Redact(cmp.Or(a.Title, string(a.Kind))), maxHeaderText)
	blocks = append(blocks, slack.NewHeaderBlock(slack.NewTextBlockObject(slack.PlainTextType, title, false, false)))
	if a.Text != "" {
		blocks = append(blocks, section(cutText(Redact(a.Text), maxSectionText)))
	}
	shownFields := a.Fields
	if len(shownFields) > maxFields {
		shownFields = append(shownFields[:maxFields-1:maxFields-1],
			Field{Label: "…", Value: fmt.Sprintf("and %d more", len(a.Fields)-(maxFields-1))})
	}
	for i := 0; i < len(shownFields); i += maxFieldsPerSec {
		var fields []*slack.TextBlockObject
		for _, f := range shownFields[i:min(i+maxFieldsPerSec, len(shownFields))] {
			t := fmt.Sprintf("*%s*\n%s", Escape(f.Label), Escape(f.Value))
			fields = append(fields, slack.NewTextBlockObject(slack.MarkdownType, cutText(Redact(t), maxFieldText), false, false))
		}
		blocks = append(blocks, slack.NewSectionBlock(nil, fields, nil))
	}

	// The command and the context line come last; reserve room for them and
	// for the "… and N more" line so the items can never push them out.
	var tail []slack.Block
	if a.Command != "" {
		// Cut the command, not the block, so the code fence stays closed.
		cmd := cutText(strings.ReplaceAll(Escape(Redact(a.Command)), "```", "'''"), maxSectionText-20)
		tail = append(tail, section("*Run:*\n```"+cmd+"```"))
	}
	tail = append(tail, slack.NewContextBlock("", slack.NewTextBlockObject(slack.MarkdownType, "pelguard · "+string(a.Kind), false, false)))

	if len(a.Items) > 0 {
		budget := maxBlocks - len(blocks) - len(tail) - 1 // one for "… and N more"
		blocks = append(blocks, itemBlocks(a, budget, threaded)...)
	}
	blocks = append(blocks, tail...)
	return message{Text: fallback(a), Blocks: blocks}
}

// itemBlocks packs the items shown inline into as few sections as Slack's
// 3,000-character limit allows, within budget blocks, and says how many
// were left out.
func itemBlocks(a Alert, budget int, threaded bool) []slack.Block {
	show := len(a.Items)
	if budget <= 0 {
		show = 0
	}
	if a.InlineItems > 0 && a.InlineItems < show {
		show = a.InlineItems
	}
	var blocks []slack.Block
	var cur strings.Builder
	if a.ItemsTitle != "" {
		cur.WriteString("*" + Escape(a.ItemsTitle) + "*\n")
	}
	shown := 0
	for _, it := range a.Items[:show] {
		line := cutText(Redact(it.Text), maxSectionText-1)
		if cur.Len() > 0 && utf8.RuneCountInString(cur.String())+1+utf8.RuneCountInString(line) > maxSectionText {
			if len(blocks) == budget-1 {
				break // the last block must stay free for what is already in cur
			}
			blocks = append(blocks, section(cur.String()))
			cur.Reset()
		}
		if cur.Len() > 0 && !strings.HasSuffix(cur.String(), "\n") {
			cur.WriteByte('\n')
		}
		cur.WriteString(line)
		shown++
	}
	if shown > 0 {
		blocks = append(blocks, section(cur.String()))
	}
	if rest := len(a.Items) - shown; rest > 0 {
		more := fmt.Sprintf("… and %d more", rest)
		if threaded {
			more += " (in the thread)"
		}
		blocks = append(blocks, section(more))
	}
	return blocks
}

// fallback is the plain text of the message: the title, the text and a count
// of the items, for notifications and clients that do not render blocks.
func fallback(a Alert) string {
	var b strings.Builder
	b.WriteString(cmp.Or(a.Title, string(a.Kind)))
	if a.Text != "" {
		b.WriteString("\n" + a.Text)
	}
	for _, f := range a.Fields {
		fmt.Fprintf(&b, "\n%s: %s", Escape(f.Label), Escape(f.Value))
	}
	if len(a.Items) > 0 {
		fmt.Fprintf(&b, "\n%d item%s", len(a.Items), plural(len(a.Items)))
	}
	if a.Command != "" {
		b.WriteString("\nRun: " + Escape(a.Command))
	}
	return cutText(Redact(b.String()), maxFallbackText)
}

func section(text string) *slack.SectionBlock {
	return slack.NewSectionBlock(slack.NewTextBlockObject(slack.MarkdownType, text, false, false), nil, nil)
}

// cutText shortens s to at most limit characters (runes, as Slack counts),
// cutting at a line break when it can and saying how much was left out.
func cutText(s string, limit int) string {
	if utf8.RuneCountInString(s) <= limit {
		return s
	}
	runes := []rune(s)
	// Leave room for the marker; 40 runes covers "\n… and 9999999 more lines".
	keep := runes[:limit-40]
	// Cut at a line break unless that would throw away most of the room.
	if i := strings.LastIndexByte(string(keep), '\n'); i > len(string(keep))/2 {
		head := string(keep)[:i]
		restLines := strings.Count(string(runes[utf8.RuneCountInString(head):]), "\n")
		return head + fmt.Sprintf("\n… and %d more line%s", restLines, plural(restLines))
	}
	rest := len(runes) - len(keep)
	return string(keep) + fmt.Sprintf("… and %d more characters", rest)
}

// cutRunes shortens s to limit runes, ending with an ellipsis.
func cutRunes(s string, limit int) string {
	if utf8.RuneCountInString(s) <= limit {
		return s
	}
	return string([]rune(s)[:limit-1]) + "…"
}

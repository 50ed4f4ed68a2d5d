package refdocs

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strings"

	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/cli/auditorcli"
	"github.com/pelguard/pelguard/internal/cli/consolecli"
	"github.com/pelguard/pelguard/internal/cli/consumercli"
	"github.com/pelguard/pelguard/internal/cli/reapercli"
	"github.com/pelguard/pelguard/internal/cmdname"
)

// binaries are the installed binaries (`make install`, the image) and the
// programs they run. The commands, their synopses, descriptions and flags
// all come from the programs themselves.
var binaries = []struct {
	installed string
	program   func() *cli.Program
}{
	{cmdname.Consumer, consumercli.Program},
	{cmdname.Reaper, reapercli.Program},
	{cmdname.Auditor, auditorcli.Program},
	{cmdname.Console, consolecli.Program},
}

// Flag is one flag of a command as its --help prints it.
type Flag struct {
	Name, Placeholder, Default, Env, Usage string
}

// Usage is a command's --help, taken apart.
type Usage struct {
	Synopsis, Description string
	Flags                 []Flag
}

// envSuffix is the convention usage strings follow to name the
// environment variable a flag's default comes from: "… [PELGUARD_X]", or
// with a note on its form: "… [PELGUARD_STREAM, comma-separated]".
var envSuffix = regexp.MustCompile(`\s*\[([A-Z][A-Z0-9_]*)(?:, ([^\]]+))?\]$`)

// HelpOf runs the command with --help, as a user would, and parses what it
// prints: the flags are those the command really registers, whatever
// function registers them. The environment must not set the variables
// flags read (the defaults would be the environment's): see Commands.
func HelpOf(ctx context.Context, c cli.Command) (Usage, error) {
	var out bytes.Buffer
	if code := c.Run(ctx, []string{"--help"}, &out, &out); code != cli.ExitOK {
		return Usage{}, fmt.Errorf("%s --help: exit %d: %s", c.Name, code, out.String())
	}
	return ParseUsage(out.String())
}

// ParseUsage parses the text cli.NewFlagSet's usage function prints:
//
//	Usage: SYNOPSIS
//
//	DESCRIPTION
//
//	Flags:
//	  --name placeholder
//	    	usage line
//	    	last usage line (default X)
func ParseUsage(text string) (Usage, error) {
	var u Usage
	head, flags, ok := strings.Cut(text, "\n\nFlags:\n")
	if !ok {
		return u, fmt.Errorf("no \"Flags:\" paragraph in the usage:\n%s", text)
	}
	syn, desc, _ := strings.Cut(head, "\n\n")
	if !strings.HasPrefix(syn, "Usage: ") {
		return u, fmt.Errorf("usage does not start with \"Usage: \":\n%s", text)
	}
	u.Synopsis = strings.TrimPrefix(syn, "Usage: ")
	// A default command's help ends with the program's command list;
	// commands.md lists the commands itself.
	if i := strings.Index(desc, "\n\nCommands:\n"); i >= 0 {
		desc = desc[:i]
	} else if strings.HasPrefix(desc, "Commands:\n") {
		desc = ""
	}
	u.Description = strings.TrimSpace(desc)
	var cur *Flag
	var usage []string
	finish := func() {
		if cur == nil {
			return
		}
		last := usage[len(usage)-1]
		// The printer appends " (default X)" to the last usage line.
		if i := strings.LastIndex(last, " (default "); i >= 0 && strings.HasSuffix(last, ")") {
			cur.Default = last[i+len(" (default ") : len(last)-1]
			usage[len(usage)-1] = last[:i]
		}
		text := strings.Join(usage, " ")
		if m := envSuffix.FindStringSubmatchIndex(text); m != nil {
			cur.Env = text[m[2]:m[3]]
			if m[4] >= 0 {
				cur.Env += " (" + text[m[4]:m[5]] + ")"
			}
			text = text[:m[0]]
		}
		cur.Usage = strings.TrimSpace(text)
		u.Flags = append(u.Flags, *cur)
		cur, usage = nil, nil
	}
	for _, line := range strings.Split(strings.TrimRight(flags, "\n"), "\n") {
		switch {
		case line == "":
		case strings.HasPrefix(line, "  --"):
			finish()
			name, ph, _ := strings.Cut(strings.TrimPrefix(line, "  --"), " ")
			cur = &Flag{Name: name, Placeholder: ph}
		case strings.HasPrefix(line, "    \t") && cur != nil:
			usage = append(usage, strings.TrimSpace(line))
		default:
			return u, fmt.Errorf("unexpected line in the flags of %q: %q", u.Synopsis, line)
		}
	}
	finish()
	return u, nil
}

// Commands renders commands.md.
func Commands(ctx context.Context) (string, error) {
	var b strings.Builder
	b.WriteString(header("Commands", "every binary's commands and flags, from each command's --help"))
	b.WriteString("A flag's default shown here is the one built in; the environment variable named beside it,\n" +
		"when set and not empty, replaces that default, and the flag given on the command line wins over both.\n" +
		"Secrets (keys, tokens, URLs with passwords) are best given in the environment, never as flags.\n\n")
	for _, bin := range binaries {
		fmt.Fprintf(&b, "- [%s](#%s)\n", bin.installed, bin.installed)
	}
	for _, bin := range binaries {
		p := bin.program()
		fmt.Fprintf(&b, "\n## %s\n\n", bin.installed)
		b.WriteString("| Command | Summary |\n|---|---|\n")
		for i, c := range p.Commands {
			name := strings.TrimSpace(c.Name + " " + c.Args)
			if i == 0 {
				name += " (default)"
			}
			fmt.Fprintf(&b, "| `%s` | %s |\n", cell(name), cell(c.Summary))
		}
		b.WriteString("| `help [COMMAND]` | this text, or a command's flags |\n")
		b.WriteString("| `version`, `--version` | the version, revision and Go version of this build |\n")
		for _, c := range p.Commands {
			u, err := HelpOf(ctx, c)
			if err != nil {
				return "", fmt.Errorf("%s %s: %w", bin.installed, c.Name, err)
			}
			fmt.Fprintf(&b, "\n### %s %s\n\n", bin.installed, c.Name)
			fmt.Fprintf(&b, "```\n%s\n```\n\n", u.Synopsis)
			if u.Description != "" {
				fmt.Fprintf(&b, "```text\n%s\n```\n\n", u.Description)
			}
			if len(u.Flags) == 0 {
				b.WriteString("No flags.\n")
				continue
			}
			b.WriteString("| Flag | Default | Environment | Usage |\n|---|---|---|---|\n")
			for _, f := range u.Flags {
				name := "--" + f.Name
				if f.Placeholder != "" {
					name += " " + f.Placeholder
				}
				fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", cell(name), code(f.Default), code(f.Env), cell(f.Usage))
			}
		}
	}
	return b.String(), nil
}

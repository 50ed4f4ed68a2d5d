package event

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// PeriodForms names the billing period forms ValidPeriod accepts, for
// error messages and help.
const PeriodForms = "2026-11 (a month), 2026-W48 (an ISO week), 2026-Q4 (a quarter) or 2026-11-30 (a day)"

// ValidPeriod reports whether s is a billing period in one of the forms
// events accept: YYYY-MM (month 01–12), YYYY-Www (an ISO week that year
// has: W53 only in a 53-week year), YYYY-Qn (Q1–Q4) or YYYY-MM-DD (a real
// date). The period is part of every idempotency key, so a typo such as
// 2026-13 must be refused, not billed as a period of its own.
func ValidPeriod(s string) error {
	if len(s) < 7 || !digits(s[:4]) || s[4] != '-' {
		return periodError(s, errors.New("want "+PeriodForms))
	}
	year, _ := strconv.Atoi(s[:4])
	rest := s[5:]
	switch {
	case len(rest) == 2 && digits(rest):
		if m, _ := strconv.Atoi(rest); m < 1 || m > 12 {
			return periodError(s, fmt.Errorf("month %s: want 01 to 12", rest))
		}
		return nil
	case len(rest) == 3 && rest[0] == 'W' && digits(rest[1:]):
		w, _ := strconv.Atoi(rest[1:])
		if n := isoWeeks(year); w < 1 || w > n {
			return periodError(s, fmt.Errorf("week %s: %d has W01 to W%02d", rest, year, n))
		}
		return nil
	case len(rest) == 2 && rest[0] == 'Q':
		if rest[1] < '1' || rest[1] > '4' {
			return periodError(s, fmt.Errorf("quarter %s: want Q1 to Q4", rest))
		}
		return nil
	case len(rest) == 5 && rest[2] == '-' && digits(rest[:2]) && digits(rest[3:]):
		if _, err := time.Parse(time.DateOnly, s); err != nil {
			return periodError(s, errors.New("not a real date"))
		}
		return nil
	}
	return periodError(s, errors.New("want "+PeriodForms))
}

func periodError(s string, err error) error {
	return fmt.Errorf("%q is not a billing period: %w", truncate(s), err)
}

// isoWeeks is how many ISO weeks year has: 53 when its 28 December (always
// in the year's last week) falls in week 53.
func isoWeeks(year int) int {
	_, w := time.Date(year, 12, 28, 0, 0, 0, 0, time.UTC).ISOWeek()
	return w
}

func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

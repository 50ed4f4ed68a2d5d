package meterledger

// SetMembersRead makes f run in FormAggregates between reading the members
// and saving the aggregates: a write there is one made while it forms.
func SetMembersRead(l *Ledger, f func()) { l.membersRead = f }

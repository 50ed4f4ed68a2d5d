package stripesim

import "time"

// Customer is a Stripe customer as stored by the emulator.
type Customer struct {
	ID          string
	Created     time.Time
	Email       string
	Name        string
	Description string
	Metadata    map[string]string
}

// CustomerSeed describes a customer to create without HTTP.
type CustomerSeed struct {
	Email       string
	Name        string
	Description string
	Metadata    map[string]string
}

// CreateCustomer stores a customer directly (no HTTP, no faults) and returns
// it; use its ID as the Stripe customer in charges.
func (s *Server) CreateCustomer(seed CustomerSeed) Customer {
	cu := s.addCustomer(seed, false)
	return cu.export()
}

func (s *Server) addCustomer(seed CustomerSeed, livemode bool) *customer {
	st := s.store
	st.mu.Lock()
	defer st.mu.Unlock()
	id, _ := st.nextID("cus")
	cu := &customer{
		id: id, created: s.Now().Unix(), email: seed.Email, name: seed.Name,
		description: seed.Description, metadata: seed.Metadata, livemode: livemode,
	}
	st.customers[id] = cu
	return cu
}

func (cu *customer) export() Customer {
	return Customer{
		ID: cu.id, Created: time.Unix(cu.created, 0).UTC(), Email: cu.email, Name: cu.name,
		Description: cu.description, Metadata: cu.metadata,
	}
}

func (s *Server) createCustomer(c *apiCall) response {
	md, resp, ok := metadataParam(c.form)
	if !ok {
		return resp
	}
	cu := s.addCustomer(CustomerSeed{
		Email: c.form.get("email"), Name: c.form.get("name"),
		Description: c.form.get("description"), Metadata: md,
	}, c.livemode)
	return jsonResp(cu.json())
}

func (s *Server) getCustomer(c *apiCall) response {
	st := s.store
	st.mu.RLock()
	defer st.mu.RUnlock()
	cu := st.customers[c.id]
	if cu == nil {
		return missing("customer", "id", c.id)
	}
	return jsonResp(cu.json())
}

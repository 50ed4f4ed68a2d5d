module example.com/leak

go 1.26

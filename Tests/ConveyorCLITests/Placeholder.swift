import Testing

@Test func placeholderUntilCLITestsLand() {}
